"""The size sweep of Chapter 5 in the paper's design (fmlab.chapters.ch5_size)."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from scripts_loader import load_script

from fmlab.chapters import ch5_size
from fmlab.chapters.ch5_implicit_bias import mlm_fisher_trace
from fmlab.data.hmm_language import HMMLanguage, HMMLanguageConfig
from fmlab.models.masked_lm import BiGRUMaskedLM
from fmlab.repro import make_generator


def _small_model(hidden=4, n_models=2):
    """A small ensemble with every weight (the initial state included) drawn away from
    zero, so that no term of the checks below vanishes by construction."""
    model = BiGRUMaskedLM(
        5,
        hidden=hidden,
        d_ff=2 * hidden,
        n_models=n_models,
        generator=make_generator(1),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.7, generator=make_generator(p.numel()))
    return model


def test_embedding_at_a_larger_hidden_size_keeps_the_function():
    """Oracle: the narrow model itself; logits equal to float32 rounding, the wide
    model's states the narrow ones with every unit repeated m times."""
    model = _small_model()
    tok, _ = HMMLanguage(HMMLanguageConfig()).sample(32, make_generator(3))
    big = ch5_size.embed_hidden(model, 12)
    assert (big.hidden, big.d_ff, big.n_models) == (12, 24, 2)
    with torch.no_grad():
        assert torch.allclose(big(tok), model(tok), rtol=0, atol=1e-5)
        wide = model.features(tok).reshape(2, 32, 10, 2, 4).repeat_interleave(3, -1)
        assert torch.allclose(big.features(tok), wide.flatten(-2), rtol=0, atol=1e-6)
        same = ch5_size.embed_hidden(model, 4)  # m = 1: the same weights
        assert all(
            torch.equal(p, q) for p, q in zip(model.parameters(), same.parameters())
        )
    with pytest.raises(ValueError, match="multiple"):
        ch5_size.embed_hidden(model, 10)
    with pytest.raises(ValueError):
        ch5_size.embed_hidden(model, 2)
    with pytest.raises(TypeError):
        ch5_size.embed_hidden(torch.nn.Linear(2, 2), 8)


def test_the_embedded_trace_is_the_native_one_with_each_tensor_rescaled():
    """Oracle: the narrow model's own Fisher trace per parameter tensor, with the same
    sentences and label draws (the predictions are the same, so are the labels); the
    embedding at m times the size multiplies each tensor's share by m**k,
    k = reads replicated units − writes them (GRU_TENSOR_EXPONENTS)."""
    model, m = _small_model(), 3
    tok, _ = HMMLanguage(HMMLanguageConfig()).sample(48, make_generator(5))
    blocks = {name: (name,) for name, _ in model.named_parameters()}
    assert set(blocks) == set(ch5_size.GRU_TENSOR_EXPONENTS)
    est = {}
    for key, net in (("narrow", model), ("wide", ch5_size.embed_hidden(model, 4 * m))):
        est[key] = mlm_fisher_trace(
            net, tok, generator=make_generator(6), blocks=blocks
        ).per_block
    for name, k in ch5_size.GRU_TENSOR_EXPONENTS.items():
        want = est["narrow"][name].per_group * m**k
        assert torch.allclose(est["wide"][name].per_group, want, rtol=1e-4), name


def test_the_size_script_writes_what_the_page_reads(tmp_path, monkeypatch):
    """A tiny sweep (two sizes, two replicates, a few steps) through the script: the
    file loads with today's fingerprint, every replicate has a gap and an accuracy per
    probe size, and size_sweep_compared keeps the sizes near the smallest mean gap."""
    script = load_script("ch5_size_sweep")
    out = tmp_path / "s.json"
    tiny = dict(sizes=(8,), n_models=3, steps=3, probe_sizes=(20,), n_probe_test=50)
    monkeypatch.setattr(ch5_size, "SIZE_SWEEP_SLICE", tiny)  # the file's slice
    config = ch5_size.SizeSweepConfig(sizes=(8, 16), n_models=2, steps=3)
    config = dataclasses.replace(config, n_trace=20)
    run = ch5_size.size_sweep_run(config, 8)
    assert len(run["gap"]) == 2 and torch.tensor(run["accuracy"]).shape == (2, 3)
    for name in ch5_size.TRACE_FIELDS:
        assert len(run[name]) == 2, name
    assert max(run["embedding_error"]) < 1e-4  # embedded at hidden size 16
    assert run["trace_embedded_encoder"] != run["trace_encoder"]
    top = ch5_size.size_sweep_run(
        config, 16
    )  # the largest: the embedding is the identity
    assert top["trace_embedded_head"] == top["trace_head"]
    assert top["embedding_error"] == [0.0, 0.0]
    assert 0.5 <= run["bayes_accuracy"] <= 1.0
    with pytest.raises(ValueError, match="size"):
        ch5_size.size_sweep_run(config, 12)
    args = ["--sizes", "16", "32", "--models", "2", "--steps", "3", "--trace", "20"]
    args += ["--out", str(out)]
    assert script.main(args) == 0
    res = ch5_size.size_sweep_results(out)
    assert res["meta"]["stored"]["script"] == "scripts/ch5_size_sweep.py"
    assert res["meta"]["stored"]["config"]["sizes"] == [16, 32]
    assert res["meta"]["stored"]["config"]["n_trace"] == 20
    assert len(res["meta"]["stored"]["slice"]["result"]["gap"]) == 3
    assert set(k for k in res if k != "meta") == {16, 32}
    for name in ch5_size.TRACE_FIELDS:
        assert res[16][name].shape == (2,), name
    assert set(res["meta"]["stored"]["slice"]["result"]) == {
        "gap",
        "accuracy",
        *ch5_size.TRACE_FIELDS[:4],
    }
    assert len(ch5_size.size_sweep_compared(res, 1e9)) == 2
    assert len(ch5_size.size_sweep_compared(res, 1e-12)) == 1
    with pytest.raises(ValueError):
        ch5_size.size_sweep_compared(res, 0.0)
    with pytest.raises(ValueError):
        ch5_size.SizeSweepConfig(tolerance=0.0)
    with pytest.raises(FileNotFoundError, match="scripts/ch5_size_sweep.py"):
        ch5_size.size_sweep_results(tmp_path / "none.json")


def test_the_stored_size_sweep_matches_its_code():
    res = ch5_size.size_sweep_results()
    cfg = res["meta"]["config"]
    assert sorted(k for k in res if k != "meta") == list(cfg["sizes"])
    for h in cfg["sizes"]:
        assert res[h]["gap"].shape == (cfg["n_models"],)
        assert res[h]["accuracy"].shape == (cfg["n_models"], len(cfg["probe_sizes"]))
    largest = max(cfg["sizes"])
    for h in cfg["sizes"]:
        for name in ch5_size.TRACE_FIELDS:
            assert res[h][name].shape == (cfg["n_models"],), (h, name)
        assert float(res[h]["embedding_error"].max()) < 1e-4, h
        assert bool((res[h]["trace_embedded_encoder"] > 0).all())
    for block in ("encoder", "head"):
        top = res[largest]
        assert torch.equal(top[f"trace_embedded_{block}"], top[f"trace_{block}"])


def test_the_trace_at_matched_gap_takes_out_a_within_size_slope():
    """Oracle: traces built as a size effect plus 50 × gap plus nothing else; the
    within-size slope is 50 and the adjusted traces are the size effects plus 50 times
    the common gap, though the gaps differ between sizes."""
    gap = torch.tensor(
        [[0.010, 0.012, 0.011], [0.005, 0.004, 0.006]], dtype=torch.float64
    )
    effect = torch.tensor([[3.0], [2.0]], dtype=torch.float64)
    trace = effect + 50 * gap
    res = {
        h: {
            "gap": gap[i],
            "trace_embedded_encoder": trace[i],
            "trace_encoder": trace[i],
        }
        for i, h in enumerate((16, 32))
    }
    out = ch5_size.size_trace_at_matched_gap(res, (16, 32))
    assert out["slope"] == pytest.approx(50.0)
    want = (effect + 50 * gap.mean()).expand(2, 3)
    assert torch.allclose(out["adjusted"], want)
    with pytest.raises(ValueError):
        ch5_size.size_trace_at_matched_gap(res, (16, 32), "decoder")
    with pytest.raises(ValueError):
        ch5_size.size_trace_at_matched_gap(res, (16,))


def test_the_page_table_and_prose_read_the_stored_traces():
    """The table and glued numbers of page 05c's flatness paragraph: one row per
    compared size, the embedded and own-width traces equal at the largest size, and
    every glued key the page cites."""
    from fmlab.chapters import ch5_figures as fig5

    res = ch5_size.size_sweep_results()
    compared = ch5_size.size_sweep_compared(res, res["meta"]["config"]["tolerance"])
    rows = fig5.size_trace_table(res, compared)
    text = str(rows)
    assert all(str(h) in text for h in compared)
    prose = fig5.prose_size_traces(res, compared)
    page = (Path(__file__).resolve().parents[2] / "notebooks").glob("05c-*.ipynb")
    cited = set(re.findall(r"ch5_szf_\w+", next(page).read_text()))
    assert cited <= set(prose), cited - set(prose)
    assert prose["ch5_szf_largest"] == str(max(res["meta"]["config"]["sizes"]))
    assert float(prose["ch5_szf_error"]) < 1e-4
