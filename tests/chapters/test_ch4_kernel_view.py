"""Chapter 4's experiment code: a diverging fine-tuning run is caught where it happens,
dropped from the grid and counted, and never reaches a kernel; the fixed-hyperparameter
analogs are validated against the grids they are read from."""

import math

import pytest
import torch

from fmlab.chapters import ch4_kernel_view as ch4
from fmlab.data.sentiment_language import SentimentLanguage, SentimentLanguageConfig
from fmlab.models.transformer import (
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
        "train": ch4.few_shot_task(lang, 4, 0),
        "val": ch4.few_shot_task(lang, 4, 0, split="validation"),
        "test": ch4.test_set(lang, 20),
    }


def test_a_diverging_run_raises_where_it_happens(prompt, data):
    task = data["train"]
    with pytest.raises(ch4.FineTuneDiverged, match=r"lr = 1e\+30"):
        ch4.fine_tune_logistic(
            prompt, task.x_prompt, task.y, ch4.LogisticFineTuneConfig("sgd", 1e30, 5)
        )
    tuned = ch4.fine_tune_logistic(
        prompt, task.x_prompt, task.y, ch4.LogisticFineTuneConfig("sgd", 1e-2, 5)
    )
    assert all(bool(torch.isfinite(p).all()) for p in tuned.parameters())


def test_the_grid_drops_and_counts_diverged_candidates(prompt, data):
    configs = [
        (1.0, ch4.LogisticFineTuneConfig("sgd", 1e-2, 5)),
        (2.0, ch4.LogisticFineTuneConfig("sgd", 1e30, 5)),
    ]
    cands = ch4._fine_tune_grid(prompt, data, "x_prompt", configs, seed=0)
    assert [bool(c.get("diverged")) for c in cands] == [False, True]
    assert cands[1]["val_acc"] < 0 and math.isinf(cands[1]["val_loss"])
    assert ch4._select(cands)["value"] == 1.0  # the finite candidate is chosen
    with pytest.raises(ch4.FineTuneDiverged, match="every candidate"):
        ch4._select(cands[1:])


def test_analog_hyperparameters_must_be_in_the_grids():
    grid = dict(
        steps=30,
        sgd_lr_scales=(0.5, 1.0, 2.0),
        kernel_regs=tuple(1 / (c * 30) for c in (0.5, 1, 2, 4, 8)),
        adam_lrs=(5e-5, 1e-4),
    )
    cfg = ch4.KernelExperimentConfig(analog_lr_scale=1.0, **grid)
    assert cfg.analog_reg("sgd") == pytest.approx(1 / 30)
    assert cfg.analog_reg("asymmetric_signgd") == pytest.approx(1 / 240)
    with pytest.raises(ValueError, match="analog_lr_scale"):
        ch4.KernelExperimentConfig(analog_lr_scale=4.0, **grid)
    with pytest.raises(ValueError, match="analog_adam_lr"):
        ch4.KernelExperimentConfig(analog_lr_scale=1.0, analog_adam_lr=1e-3, **grid)
    with pytest.raises(ValueError, match="kernel_regs"):
        ch4.KernelExperimentConfig(
            analog_lr_scale=1.0, **{**grid, "kernel_regs": (1e-3, 1e-2)}
        )
