"""Tests of the same-loss runners of Chapter 5 (fmlab.chapters.ch5_implicit_bias and
ch5_sgd_noise) at tiny configs.

Oracles: the shapes and identities the chapter relies on (the pretrained model is the
continued run's first checkpoint; the look-up table of untied emissions reads the block
better than chance), and monotone data for the rank correlation.
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
