"""Tests of the same-loss runners of Chapter 5 (fmlab.chapters.ch5_implicit_bias and
ch5_sgd_noise) at tiny configs.

Oracles: the shapes and identities the chapter relies on (the pretrained model is the
continued run's first checkpoint; the look-up table of untied emissions reads the block
better than chance), monotone data for the rank correlation, and the library's
learning-rate schedule for both training loops.
"""

import pytest
import torch

from fmlab.chapters import ch5_implicit_bias as ch5
from fmlab.chapters import ch5_sgd_noise as ch5t
from fmlab.data.hmm_language import HMMLanguageConfig

TINY = ch5.SameLossConfig(
    n_models=2,
    hidden=4,
    d_ff=6,
    pretrain_steps=4,
    pretrain_batch=8,
    continue_steps=4,
    continue_batch=8,
    n_checkpoints=2,
    adversarial_steps=2,
    adversarial_batch=16,
    reconverge_steps=2,
    probe_sizes=(20, 40),
    n_probe_test=50,
    n_gap=30,
    n_trace=6,
    n_bartlett=4,
    bartlett_probes=2,
    recovery_steps=2,
    recovery_batches=(8, 8),
    recovery_sizes=(20, 40),
    recovery_test=30,
)


def test_the_same_loss_experiment_at_a_tiny_config():
    res = ch5.same_loss_experiment(TINY)
    E, k = TINY.n_models, TINY.n_checkpoints + 1
    assert res["continue_gap"].shape == (k, E)
    assert res["continue_accuracy"].shape == (k, E, 2)
    for name in ("adversarial", "control"):
        assert res[f"{name}_trace_encoder"].shape == (E,)
        total = res[f"{name}_trace"]
        blocks = res[f"{name}_trace_encoder"] + res[f"{name}_trace_head"]
        assert torch.allclose(total, blocks, rtol=1e-5)
    models = ch5.equal_loss_models(res, size_index=1)
    assert list(models) == [
        "pretrained",
        "SGD-continued",
        "control (Adam)",
        "adversarial",
    ]
    tot, enc, head, acc = models["pretrained"]
    assert torch.equal(tot, res["continue_trace"][0])
    assert torch.equal(acc, res["continue_accuracy"][0, :, 1])


def test_equal_loss_rank_correlation_per_block_and_seed():
    up = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]).double()
    down = up.flip(0)
    models = {  # three models, two seeds: (total, encoder, head, accuracy)
        f"m{i}": (up[i], down[i], up[i], up[i] / 10) for i in range(3)
    }
    rho = ch5.equal_loss_rank_correlation(models)
    assert torch.equal(rho["total"], torch.ones(2, dtype=torch.float64))
    assert torch.equal(rho["encoder"], -torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="models"):
        ch5.equal_loss_rank_correlation({"one": models["m0"]})


def test_lookup_tables_tied_and_untied():
    cfg = ch5.LookupConfig(worlds=(0,), n_train=400, n_test=400)
    runs = ch5.lookup_tables(cfg, HMMLanguageConfig(), position=5)
    assert set(runs) == {True, False} and len(runs[True]) == 1
    assert runs[False][0]["lookup"] > 0.75  # untied emissions name the block
    assert runs[True][0]["lookup"] < 0.65  # tied: the block is summed out


def test_rank_correlation_of_monotone_models():
    trace = torch.tensor([[4.0, 1.0], [3.0, 2.0], [2.0, 3.0], [1.0, 4.0]]).double()
    acc = torch.tensor([[0.1, 0.1], [0.2, 0.2], [0.3, 0.3], [0.4, 0.4]])[..., None]
    rho = ch5t.trace_transfer_rank_correlation({"trace": trace, "accuracy": acc})
    assert torch.allclose(rho, torch.tensor([-1.0, 1.0], dtype=rho.dtype))


def test_both_training_loops_follow_the_librarys_schedule(monkeypatch):
    """train_phase and train_bert hand :func:`fmlab.train.lr_factor` to the loop: the
    ramp times the cosine (or the ramp alone), and the constant-then-decay line."""
    from fmlab.data.hmm_language import HMMLanguage
    from fmlab.models.bert import BertConfig, EnsembleBert
    from fmlab.models.masked_lm import BiGRUMaskedLM
    from fmlab.train import lr_factor

    factors = []

    def record(model, step_loss, *, steps, lr_factor, **kwargs):  # no training
        factors.append([lr_factor(s) for s in range(steps + 1)])

    monkeypatch.setattr(ch5, "train_scheduled", record)
    monkeypatch.setattr(ch5t, "train_scheduled", record)
    lang = HMMLanguage(HMMLanguageConfig())
    gru = BiGRUMaskedLM(lang.config.vocab_size, hidden=2, d_ff=2)
    for cosine in (True, False):
        ch5.train_phase(
            gru, lang, steps=30, batch=1, lr=1.0, warmup=4, cosine=cosine,
            generator=torch.Generator(),
        )  # fmt: skip
    shape = BertConfig(
        lang.config.vocab_size, lang.config.length, d_model=4, n_layers=1
    )
    bert = EnsembleBert(shape)
    for schedule in ("cosine", "constant-then-decay"):
        ch5t.train_bert(
            bert, lang, steps=30, batch=1, lr=1.0, optimizer="sgd", warmup=4,
            schedule=schedule, decay_fraction=0.2, generator=torch.Generator(),
        )  # fmt: skip
    expected = [
        dict(warmup=4),
        dict(warmup=4, shape="constant"),
        dict(warmup=4),
        dict(shape="linear", decay_start=24),  # no warm-up; the last 20% decays
    ]
    for got, kw in zip(factors, expected, strict=True):
        assert got == [lr_factor(s, steps=30, **kw) for s in range(31)]
