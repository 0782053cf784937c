"""Chapter 4's experiment code: a diverging fine-tuning run is caught where it happens,
dropped from the grid and counted, and never reaches a kernel; the fixed-hyperparameter
analogs are validated against the grids they are read from."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from fmlab.chapters import ch4_fewshot as ch4f
from fmlab.chapters import ch4_kernel_behaviour as ch4b
from fmlab.chapters import ch4_kernel_view as ch4
from fmlab.chapters import ch4_world as ch4w
from fmlab.data.sentiment_language import SentimentLanguage, SentimentLanguageConfig
from fmlab.models.transformer import (
    CLSClassifier,
    PromptClassifier,
    TinyTransformer,
    TransformerConfig,
)


@pytest.fixture(scope="module")
def lang():
    return SentimentLanguage(SentimentLanguageConfig(max_units=4))


@pytest.fixture(scope="module")
def prompt(lang):
    cfg = TransformerConfig(
        vocab_size=lang.vocab_size,
        max_len=lang.seq_len,
        d_model=8,
        n_layers=1,
        n_heads=2,
        pad_id=lang.pad_id,
    )
    return PromptClassifier(TinyTransformer(cfg, seed=3), lang)


@pytest.fixture(scope="module")
def data(lang):
    return {
        "train": ch4w.few_shot_task(lang, 4, 0),
        "val": ch4w.few_shot_task(lang, 4, 0, split="validation"),
        "test": ch4w.test_set(lang, 20),
    }


def test_a_diverging_run_raises_where_it_happens(prompt, data):
    task = data["train"]
    with pytest.raises(ch4w.FineTuneDiverged, match=r"lr = 1e\+30"):
        ch4w.fine_tune_logistic(
            prompt, task.x_prompt, task.y, ch4w.LogisticFineTuneConfig("sgd", 1e30, 5)
        )
    tuned = ch4w.fine_tune_logistic(
        prompt, task.x_prompt, task.y, ch4w.LogisticFineTuneConfig("sgd", 1e-2, 5)
    )
    assert all(bool(torch.isfinite(p).all()) for p in tuned.parameters())


def test_the_grid_drops_and_counts_diverged_candidates(prompt, data):
    grid = [(1.0, 1e-2), (2.0, 1e30)]
    cands, wide, n = ch4f._fine_tune_grid(prompt, data, "x_prompt", "sgd", grid, 5)
    assert [bool(c.get("diverged")) for c in cands] == [False, True]
    assert cands[1]["val_acc"] < 0 and math.isinf(cands[1]["val_loss"])
    assert ch4w._select(cands)["value"] == 1.0  # the finite candidate is chosen
    assert wide == [] and n == 0
    with pytest.raises(ch4w.FineTuneDiverged, match="every candidate"):
        ch4w._select(cands[1:])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_stacked_grid_is_the_runs_one_at_a_time(prompt, data, optimizer):
    # the oracle: fine_tune_logistic, one run at a time, stopped at each checkpoint;
    # the run at 1e30 diverges at once (as it does alone) and leaves the others as
    # they are
    task, x_test = data["train"], data["test"].x_prompt
    lrs = [1e-2, 3e-2] if optimizer == "adam" else [1e-1, 1.0, 1e30]
    stops = [(2, 5)] * len(lrs)
    reads, diverged = ch4f._fine_tune_stacked(
        prompt, task.x_prompt, task.y, optimizer, lrs, stops
    )
    for lr, read, div in zip(lrs, reads, diverged):
        for t in (2, 5):
            cfg = ch4w.LogisticFineTuneConfig(optimizer, lr, t)
            try:
                alone = ch4w.fine_tune_logistic(prompt, task.x_prompt, task.y, cfg)
            except ch4w.FineTuneDiverged:
                assert t not in read and div
                continue
            stacked = ch4f._tuned(prompt, read[t])
            torch.testing.assert_close(
                ch4w.outputs(stacked, x_test),
                ch4w.outputs(alone, x_test),
                rtol=1e-4,
                atol=1e-4,
            )
    if optimizer == "sgd":
        assert diverged == [False, False, True] and reads[2] == {}
    together = ch4f._stacked_outputs(prompt, [r[5] for r in reads[:2]], x_test)
    for row, read in zip(together, reads[:2]):
        torch.testing.assert_close(
            row, ch4w.outputs(ch4f._tuned(prompt, read[5]), x_test)
        )


def test_trimming_the_padding_leaves_the_outputs(prompt, lang, data):
    task = ch4w.few_shot_task(lang, 8, 1)
    cut = ch4f._trimmed(task, lang.pad_id)
    assert cut.x_plain.shape[1] < task.x_plain.shape[1]
    torch.testing.assert_close(
        ch4w.outputs(prompt, cut.x_prompt), ch4w.outputs(prompt, task.x_prompt)
    )


def test_checkpoints_are_the_shorter_runs(prompt, data):
    task, seen = data["train"], {}

    def keep(t, model):
        seen[t] = ch4w.outputs(model, data["test"].x_prompt)

    cfg = ch4w.LogisticFineTuneConfig("sgd", 1e-2, 6)
    ch4w.fine_tune_logistic(
        prompt, task.x_prompt, task.y, cfg, checkpoints=(2, 6), on_checkpoint=keep
    )
    for t in (2, 6):  # full-batch steps: the checkpoint is the run stopped there
        short = ch4w.fine_tune_logistic(
            prompt, task.x_prompt, task.y, ch4w.LogisticFineTuneConfig("sgd", 1e-2, t)
        )
        assert torch.equal(seen[t], ch4w.outputs(short, data["test"].x_prompt))
    with pytest.raises(ValueError, match="checkpoints"):
        ch4w.fine_tune_logistic(prompt, task.x_prompt, task.y, cfg, checkpoints=(7,))


def test_the_wide_grid_keeps_the_checkpoints_before_a_divergence(prompt, data):
    grid = [(1.0, 1e30)]  # every lazy run diverges
    # the wide run at 1e5 reaches its first checkpoint, then diverges (as it does
    # alone, in fine_tune_logistic with the same checkpoints)
    wide_runs = [(1.0, 1e-2, (1, 3)), (2.0, 1e5, (1, 3))]
    lazy, wide, diverged = ch4f._fine_tune_grid(
        prompt, data, "x_prompt", "sgd", grid, 2, wide=wide_runs
    )
    assert diverged == 1 and lazy[0]["diverged"]
    steps = sorted((c["scale"], c["steps"]) for c in wide)
    assert steps == [(1.0, 1), (1.0, 3), (2.0, 1)]  # the diverged run's step 1 kept
    cfg = ch4f.KernelExperimentConfig(shots=(4,), steps=2, sgd_lr_scales=(1.0,))
    best = ch4f._wide_grid(prompt, data, "x_prompt", lazy, wide, cfg, {})
    # the chosen run's kernel behaviour (the run the paper's Table 7 measures)
    assert best["stats"]["kernel_change"] >= 0
    assert torch.equal(best["test"], best["stats"]["f_ft"])
    assert best["test"].shape == data["test"].y.shape
    assert bool(torch.isfinite(best["test"]).all())
    assert all("test" not in c for c in wide if c is not best)


def test_a_checkpoint_with_a_non_finite_loss_raises(prompt, data):
    task = data["train"]
    with pytest.raises(ch4w.FineTuneDiverged, match="checkpoint|loss|parameter"):
        ch4w.fine_tune_logistic(
            prompt,
            task.x_prompt,
            task.y,
            ch4w.LogisticFineTuneConfig("sgd", 1e30, 3),
            checkpoints=(1,),
            on_checkpoint=lambda t, m: None,
        )


def test_the_wide_grid_config_and_ridges():
    with pytest.raises(ValueError, match="together"):
        ch4f.KernelExperimentConfig(wide_scales=(4.0,))
    grid = ch4f.wide_grid(30)
    assert 1 / (64 * 100) in grid["kernel_regs"] and 1 / 30 in grid["kernel_regs"]
    assert len(set(grid["kernel_regs"])) == len(grid["kernel_regs"])


@pytest.mark.parametrize("setting", ["prompt", "standard"])
def test_the_same_steps_analog_follows_a_lazy_fine_tuning_run(prompt, data, setting):
    # at a small rate fine-tuning is nearly linear, so its test outputs after T steps
    # are those of T gradient steps of the eNTK in function space (same rate c / K̄);
    # the standard model's Jacobian includes its head
    from fmlab.models.transformer import CLSClassifier
    from fmlab.theory.kernels import jacobian

    model = prompt if setting == "prompt" else CLSClassifier(prompt.mlm, seed=1)
    x_key = "x_prompt" if setting == "prompt" else "x_plain"
    x = {s: getattr(data[s], x_key) for s in ("train", "test")}
    j = {s: jacobian(model, x[s]) for s in ("train", "test")}
    f0 = {s: ch4w.outputs(model, x[s]) for s in ("train", "test")}
    y = {s: data[s].y for s in ("train", "test")}
    scale, steps = 0.05, 5
    lr = scale / float(j["train"].pow(2).sum(1).mean())
    tuned = ch4w.fine_tune_logistic(
        model, x["train"], y["train"], ch4w.LogisticFineTuneConfig("sgd", lr, steps)
    )
    f_ft = ch4w.outputs(tuned, x["test"]).double()
    f_k = ch4b.same_steps_outputs(j, f0, y, scale, steps)
    moved = (f_ft - f0["test"].double()).norm()
    assert moved > 0
    assert (f_ft - f_k).norm() / moved < 0.03


def test_analog_hyperparameters_must_be_in_the_grids():
    grid = dict(
        steps=30,
        sgd_lr_scales=(0.5, 1.0, 2.0),
        kernel_regs=tuple(1 / (c * 30) for c in (0.5, 1, 2, 4, 8)),
        adam_lrs=(5e-5, 1e-4),
    )
    cfg = ch4f.KernelExperimentConfig(analog_lr_scale=1.0, **grid)
    assert cfg.analog_reg("sgd") == pytest.approx(1 / 30)
    assert cfg.analog_reg("asymmetric_signgd") == pytest.approx(1 / 240)
    with pytest.raises(ValueError, match="analog_lr_scale"):
        ch4f.KernelExperimentConfig(analog_lr_scale=4.0, **grid)
    with pytest.raises(ValueError, match="analog_adam_lr"):
        ch4f.KernelExperimentConfig(analog_lr_scale=1.0, analog_adam_lr=1e-3, **grid)
    with pytest.raises(ValueError, match="kernel_regs"):
        ch4f.KernelExperimentConfig(
            analog_lr_scale=1.0, **{**grid, "kernel_regs": (1e-3, 1e-2)}
        )


# -- the runners of the chapter's two pages, at a tiny config
TINY = ch4.ChapterConfig(
    d_model=8,
    pretrain_steps=3,
    pretrain_seeds=(0, 1),
    narrow=4,
    narrow_steps=2,
    n_test=20,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("FMLAB_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    yield ch4.setting(TINY)
    mp.undo()


def test_the_chapter_config_builds_the_pretraining_config():
    pre = ch4.ChapterConfig().pretrain
    assert pre == ch4w.MLMPretrainConfig(
        language=SentimentLanguageConfig(prior_positive=0.8)
    )
    assert ch4.ChapterConfig().widths == (16, 32)
    with pytest.raises(ValueError):
        ch4.ChapterConfig(pretrain_seeds=())


def test_setting_scores_the_prompt_it_returns(tiny):
    f = ch4w.outputs(tiny.prompt_model, tiny.test.x_prompt)
    assert tiny.zero_shot == ch4w.sign_accuracy(f, tiny.test.y)
    assert tiny.n_params == sum(p.numel() for p in tiny.prompt_model.parameters())
    assert tiny.pretrain_losses.shape == (TINY.pretrain_steps,)
    assert 0.5 < tiny.bayes_accuracy <= 1.0


def test_lazy_grid_pairs_each_ridge_with_a_learning_rate():
    grid = ch4f.lazy_grid(30)
    assert grid["sgd_lr_scales"] == (0.5, 1.0, 2.0)
    assert grid["kernel_regs"] == pytest.approx(
        [1 / 15, 1 / 30, 1 / 60, 1 / 120, 1 / 240]
    )
    cfg = ch4f.KernelExperimentConfig(analog_lr_scale=1.0, adam_lrs=(5e-5,), **grid)
    assert cfg.analog_reg("sgd") == pytest.approx(1 / 30)


def test_best_multiple_residual_is_the_sine_of_the_angle():
    a = torch.tensor([1.0, 2.0, -1.0], dtype=torch.float64)
    k = torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64)
    cos = (a @ k) / (a.norm() * k.norm())
    assert ch4.best_multiple_residual(a, k) == pytest.approx(float((1 - cos**2).sqrt()))
    assert ch4.best_multiple_residual(a, -3 * a) == pytest.approx(0.0, abs=1e-12)


def test_signgd_steps_are_first_order(tiny):
    step = ch4.signgd_steps(tiny, (1e-6, 1e-5), n_examples=2, n_eval=5, shots=2)
    assert step.errors.shape == step.entk_residual.shape == (2, 2)
    assert (step.errors[:, 0] < 1e-3).all()
    ratio = step.errors[:, 1] / step.errors[:, 0]  # an error first order in the step
    assert ((ratio > 5) & (ratio < 20)).all()


def test_few_shot_runs_merge_the_experiments(tiny):
    grid = ch4f.lazy_grid(2)
    configs = tuple(
        ch4f.KernelExperimentConfig(
            shots=(k,), seeds=(0, 1, 2), n_test=20, methods="sgd", **grid
        )
        for k in (1, 2)
    )
    runs = ch4f.few_shot_runs(TINY.pretrain, configs)
    one = ch4f.run_kernel_experiment(TINY.pretrain, configs[1])
    key = ("prompt", "SGD-FT", 2)
    assert runs.shots == (1, 2)
    assert runs.accuracy[key].tolist() == one.accuracy[key]
    assert runs.points(key[:2], ("standard", "SGD-FT"), 2) == pytest.approx(
        [
            100 * (a - b)
            for a, b in zip(one.accuracy[key], one.accuracy[("standard", "SGD-FT", 2)])
        ]
    )
    lin = runs.dynamics
    assert runs.log_ratio("lin_error", 2) == pytest.approx(
        np.log(
            lin[("standard", "SGD", 2)]["lin_error"]
            / lin[("prompt", "SGD", 2)]["lin_error"]
        )
    )
    kc = [np.asarray(runs.by_lr[("prompt", k)]["kernel_change"]) for k in (1, 2)]
    growth = np.concatenate([np.log(c[:, -1] / c[:, 0]) for c in kc])
    assert runs.kernel_change_growth() == pytest.approx(growth)
    assert runs.lr_scales == {1: grid["sgd_lr_scales"], 2: grid["sgd_lr_scales"]}
    assert runs.diverged == sum(one.diverged.values()) + sum(
        ch4f.run_kernel_experiment(TINY.pretrain, configs[0]).diverged.values()
    )


def test_lora_kernel_meets_the_lemma_and_shrinks_with_rank(tiny):
    cfg = ch4.LoRAKernelConfig(rank=2, ranks=(1, 64), projections=4, shots=2)
    lora = ch4.lora_kernel(tiny, cfg)
    assert lora.lemma_difference < 1e-4
    err = {r: np.mean(lora.errors.errors[r]) for r in cfg.ranks}
    assert err[64] < err[1]
    assert lora.max_input_dim == 4 * TINY.d_model  # the MLP's second matrix


def test_width_test_and_label_words(tiny):
    stats = ch4.width_test(TINY)
    assert set(stats) == {(m, w) for m in ("chi", "accuracy") for w in (4, 8)}
    assert all(len(v) == 2 for v in stats.values())
    assert 0 < ch4.bayes_output_derivative(tiny.lang, 2000) < 0.5
    words = ch4.label_word_swap(tiny, shots=2, seeds=(0, 1))
    f = ch4w.outputs(
        PromptClassifier(tiny.mlm, tiny.lang, label_words=("movie", "film")),
        tiny.test.x_prompt,
    )
    assert words.zero_shot == ch4w.sign_accuracy(f, tiny.test.y)
    assert words.entk.shape == words.entk_natural.shape == (2,)


def test_stacked_pretraining_matches_separate_runs(tmp_path, monkeypatch):
    """Oracle: the same models trained one at a time by pretrain_masked_lm."""
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    base = ch4w.MLMPretrainConfig(
        language=SentimentLanguageConfig(max_units=4), d_model=8, n_heads=2, steps=6
    )
    configs = tuple(dataclasses.replace(base, seed=s) for s in (0, 3))
    stacked = ch4w.pretrain_masked_lms_stacked(configs)
    for config, (model, losses) in zip(configs, stacked):
        alone, alone_losses = ch4w.pretrain_masked_lm(config)
        assert losses[0] == alone_losses[0]  # the first step's loss: bit for bit
        torch.testing.assert_close(losses, alone_losses, rtol=1e-4, atol=1e-5)
        # the functions (not every weight: the key bias of attention has a zero gradient
        # in exact arithmetic, so Adam turns its rounding noise into steps of size lr)
        x = ch4w.test_set(SentimentLanguage(base.language), 20).x_prompt
        torch.testing.assert_close(model(x), alone(x), rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="only in their seed"):
        ch4w.pretrain_masked_lms_stacked((base, dataclasses.replace(base, lr=1e-3)))


def test_start_measures_read_the_head_share_and_the_output_derivative(prompt, data):
    from fmlab.theory.kernels import jacobian

    x, y = data["train"].x_plain, data["train"].y
    std0 = CLSClassifier(prompt.mlm, seed=0)  # a fresh head: Γ ~ N(0, I/d), c = 0
    j = jacobian(std0, x)
    f0 = ch4w.outputs(std0, x)
    got = ch4b.start_measures(std0, j, f0, {"train": y})
    # the head's gradient is (h_[CLS], 1): its share of tr K is Σ(|h|² + 1) / tr K
    h = ch4w.outputs(std0.mlm.hidden, x)[:, 0].double()
    share = float((h.pow(2).sum(1) + 1).sum() / j.double().pow(2).sum())
    assert got["head_share"] == pytest.approx(share, rel=1e-4)
    chi = (y * torch.sigmoid(-y * f0)).abs().mean()
    assert got["chi_train"] == pytest.approx(float(chi))
    assert (
        ch4b.start_measures(
            prompt,
            jacobian(prompt, data["train"].x_prompt),
            ch4w.outputs(prompt, data["train"].x_prompt),
            {"train": y},
        )["head_share"]
        == 0.0
    )
    with pytest.raises(ValueError, match="standard_head"):
        ch4f.KernelExperimentConfig(standard_head="zero")


def test_the_batch1_signgd_analog_follows_a_small_signgd_run(prompt, data):
    # Theorem 4.3 per example: at a small rate, a batch-1 SignGD run's test outputs are
    # those of its A-SignGD kernel analog taken in the run's own order of examples
    from fmlab.theory.kernels import jacobian

    x = {s: data[s].x_prompt for s in ("train", "test")}
    y = {s: data[s].y for s in ("train", "test")}
    j = {s: jacobian(prompt, x[s]) for s in ("train", "test")}
    f0 = {s: ch4w.outputs(prompt, x[s]) for s in ("train", "test")}
    lr, steps = 1e-4, 12  # 8 examples: one and a half passes, a reshuffle between
    assert sorted(ch4b.batch1_order(8, steps, 3)[:8]) == list(range(8))
    tuned = ch4w.fine_tune_logistic(
        prompt,
        x["train"],
        y["train"],
        ch4w.LogisticFineTuneConfig("signgd", lr, steps, batch_size=1),
        seed=3,
    )
    f_ft = ch4w.outputs(tuned, x["test"]).double()
    f_k = ch4b.signgd_same_steps_outputs(j, f0, y, lr, steps, 3)
    moved = (f_ft - f0["test"].double()).norm()
    assert moved > 0
    assert (f_ft - f_k).norm() / moved < 0.05
    other = ch4b.signgd_same_steps_outputs(j, f0, y, lr, steps, 4)  # another order
    assert (f_ft - f_k).norm() < (f_ft - other).norm()


def test_sentence_units_count_the_words_of_the_decoded_sentences(lang):
    """Oracle: the decoded text, word by word (a unit is a word, with or without
    *not* before it; the statement and the special tokens are no units)."""
    x = lang.sample_pretraining(50, torch.Generator().manual_seed(1))
    other = {"[PAD]", "[MASK]", "[CLS]", ".", "it", "was", "great", "terrible", "not"}
    counts = [sum(w not in other for w in text.split()) for text in lang.decode(x)]
    assert ch4w.sentence_units(lang, x).tolist() == counts
    c = lang.config
    length = ch4w.MLMPretrainConfig(cls_task="length", cls_weight=1.0)
    labels = ch4w.cls_labels(lang, x, length, None)
    assert labels.tolist() == [float(2 * n > c.min_units + c.max_units) for n in counts]


def test_a_full_topic_tilt_draws_every_neutral_word_from_the_topic_half(lang):
    x = lang.sample_pretraining(40, torch.Generator().manual_seed(2))
    tilted, topic = ch4w.tilt_topic(lang, x, 1.0, torch.Generator().manual_seed(3))
    neutral = lang.neutral_ids
    half = len(neutral) // 2
    is_neutral = torch.isin(x, neutral)
    assert torch.equal(tilted[~is_neutral], x[~is_neutral])  # only neutral words move
    for row, t in zip(range(len(x)), topic.tolist()):
        words = tilted[row][is_neutral[row]]
        allowed = neutral[:half] if t > 0 else neutral[half:]
        assert bool(torch.isin(words, allowed).all())
    same, _ = ch4w.tilt_topic(lang, x, 0.0, torch.Generator().manual_seed(3))
    assert torch.equal(same, x)


def test_the_cls_task_needs_its_weight_and_its_topics():
    with pytest.raises(ValueError, match="go together"):
        ch4w.MLMPretrainConfig(cls_task="length")
    with pytest.raises(ValueError, match="go together"):
        ch4w.MLMPretrainConfig(cls_weight=1.0)
    with pytest.raises(ValueError, match="topic_tilt"):
        ch4w.MLMPretrainConfig(cls_task="topic", cls_weight=1.0)
    with pytest.raises(ValueError, match="cls_task"):
        ch4w.MLMPretrainConfig(cls_task="nsp", cls_weight=1.0)
