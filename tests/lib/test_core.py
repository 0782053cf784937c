"""fmlab's core: validation, seeding, claims, the training loop and its cache."""

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

import fmlab
from fmlab import (
    ClaimFailed,
    cached,
    claim,
    claims_table,
    config_hash,
    reset_claims,
    seed_everything,
    train,
)
from fmlab._validate import check_float, check_int, check_tensor
from fmlab.repro import code_fingerprint, import_closure, package_imports


# -- validation -------------------------------------------------------------------
def test_check_int_names_argument():
    with pytest.raises(TypeError, match="steps must be an integer"):
        check_int("steps", 1.5)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        check_int("steps", 0, minimum=1)
    with pytest.raises(TypeError, match="flag"):
        check_int("flag", True)


def test_check_float_and_tensor():
    with pytest.raises(ValueError, match="lr must be > 0"):
        check_float("lr", 0.0, minimum=0.0, strict_min=True)
    with pytest.raises(ValueError, match="finite"):
        check_float("lr", float("nan"))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        check_tensor("x", [1.0])
    with pytest.raises(ValueError, match="x must have 2 dimensions"):
        check_tensor("x", torch.zeros(3), ndim=2)
    with pytest.raises(ValueError, match="size 4 along axis 1"):
        check_tensor("x", torch.zeros(3, 5), shape=(None, 4))
    with pytest.raises(TypeError, match="floating dtype"):
        check_tensor("x", torch.zeros(3, dtype=torch.long), floating=True)
    with pytest.raises(ValueError, match="NaN"):
        check_tensor("x", torch.tensor([float("nan")]))


# -- seeding ----------------------------------------------------------------------
def test_seed_everything_reproduces_numbers():
    seed_everything(3)
    a = torch.randn(5)
    seed_everything(3)
    b = torch.randn(5)
    assert torch.equal(a, b)
    g1, g2 = fmlab.make_generator(7), fmlab.make_generator(7)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))
    with pytest.raises(ValueError, match="seed"):
        seed_everything(-1)


def test_seed_everything_turns_deterministic_algorithms_on_without_inductor():
    """Oracle: torch's own report of the flags; in a fresh process, since the flags
    are global."""
    import subprocess
    import sys

    code = (
        "import sys, torch, fmlab; fmlab.seed_everything(0);"
        "print(torch.are_deterministic_algorithms_enabled(),"
        " torch.is_deterministic_algorithms_warn_only_enabled(),"
        " 'torch._inductor' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", "True", "False"]


@dataclass(frozen=True)
class _Cfg:
    a: int = 1
    b: float = 0.5
    name: str = "x"


def test_config_hash_is_stable_and_sensitive():
    assert config_hash(_Cfg()) == config_hash(_Cfg())
    assert config_hash(_Cfg()) != config_hash(_Cfg(b=0.25))
    assert re.fullmatch(r"[0-9a-f]{16}", config_hash(_Cfg()))
    with pytest.raises(TypeError, match="config"):
        config_hash({"bad": object()})


# -- claims -----------------------------------------------------------------------
def test_claim_verifies_and_raises(capsys):
    reset_claims()
    assert claim("two is bigger than one", 2 > 1, "2 > 1") is None
    shown = capsys.readouterr().out
    assert "✔ verified check: two is bigger than one (2 > 1)" in shown
    with pytest.raises(ClaimFailed, match="one is bigger than two"):
        claim("one is bigger than two", 1 > 2, "1 < 2")
    assert len(claims_table().records) == 1
    with pytest.raises(TypeError, match="condition must be a bool"):
        claim("a tensor is not a verdict", torch.tensor([1.0, 2.0]))
    claim("tensor bool", torch.tensor(True))
    assert "tensor bool" in capsys.readouterr().out
    with pytest.raises(TypeError, match="statement"):
        claim("", True)


# -- training and cache -----------------------------------------------------------
def _fit_line(steps=200):
    seed_everything(0)
    model = nn.Linear(1, 1)
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    y = 3 * x - 1
    res = train(
        model,
        lambda m, b: (m(b[0]) - b[1]).pow(2).mean(),
        lambda step: (x, y),
        steps=steps,
        lr=0.05,
        checkpoints=(0, steps),
    )
    return model, res


def test_train_fits_a_line_and_keeps_checkpoints():
    model, res = _fit_line()
    assert res.losses[-1] < 1e-3 < res.losses[0]
    assert set(res.checkpoints) == {0, 200}
    assert torch.allclose(model.weight, torch.tensor([[3.0]]), atol=0.05)
    with pytest.raises(ValueError, match="steps"):
        train(
            model, lambda m, b: m(b).sum(), lambda s: torch.zeros(1, 1), steps=0, lr=0.1
        )
    with pytest.raises(ValueError, match="optimizer"):
        train(
            model,
            lambda m, b: m(b).sum(),
            lambda s: torch.zeros(1, 1),
            steps=1,
            lr=0.1,
            optimizer="lbfgs",
        )


def test_train_is_deterministic():
    _, a = _fit_line(50)
    _, b = _fit_line(50)
    assert torch.equal(a.losses, b.losses)


def test_cache_builds_once_and_survives_interruption(tmp_path, monkeypatch):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    calls = []

    def build():
        calls.append(1)
        return {"w": torch.arange(3.0)}

    first = cached(_Cfg(), build, name="demo")
    (entry,) = tmp_path.glob("demo-*.pt")
    second = cached(_Cfg(), build, name="demo")
    assert torch.equal(first["w"], second["w"]) and len(calls) == 1
    cached(_Cfg(a=2), build, name="demo")
    assert len(calls) == 2
    # a corrupt entry (as left by a crash of an older, non-atomic writer) is rebuilt
    entry.write_bytes(b"not a checkpoint")
    assert torch.equal(cached(_Cfg(), build, name="demo")["w"], torch.arange(3.0))
    assert len(calls) == 3
    # a build that fails leaves no entry and no temporary file behind
    with pytest.raises(RuntimeError):
        cached(
            _Cfg(a=9), lambda: (_ for _ in ()).throw(RuntimeError("boom")), name="demo"
        )
    assert len(list(tmp_path.glob("demo-*"))) == 2  # the entries of a=1 and a=2 only
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    with pytest.raises(ValueError, match="name"):
        cached(_Cfg(), build, name="not a name")


@pytest.mark.parametrize("seed_offset_zero", [True, False])
@pytest.mark.parametrize("was_set", [True, False])
def test_fresh_model_cache_is_empty_and_restores_the_environment(
    tmp_path, monkeypatch, seed_offset_zero, was_set
):
    """Inside: an empty cache of its own (an entry of the outer cache is not read,
    an entry made inside is not seen outside) and, by default, seed offset 0. After:
    both variables exactly as before, set or unset, also when the block raises."""
    from fmlab.train import cache_dir, fresh_model_cache

    outer = tmp_path / "outer"
    if was_set:
        monkeypatch.setenv("FMLAB_CACHE_DIR", str(outer))
        monkeypatch.setenv("FMLAB_SEED_OFFSET", "3")
    else:
        monkeypatch.delenv("FMLAB_CACHE_DIR", raising=False)
        monkeypatch.delenv("FMLAB_SEED_OFFSET", raising=False)
    before = {n: os.environ.get(n) for n in ("FMLAB_CACHE_DIR", "FMLAB_SEED_OFFSET")}
    calls = []

    def build():
        calls.append(1)
        return {"x": torch.ones(1)}

    if was_set:
        cached(_Cfg(), build, name="fresh")  # an outer entry
    for raises in (False, True):
        with pytest.raises(RuntimeError) if raises else contextlib.nullcontext():
            with fresh_model_cache(seed_offset_zero=seed_offset_zero):
                inner = cache_dir()
                assert inner != outer and not list(inner.iterdir())
                offset = os.environ.get("FMLAB_SEED_OFFSET")
                assert offset == (
                    None if seed_offset_zero else before["FMLAB_SEED_OFFSET"]
                )
                cached(_Cfg(), build, name="fresh")  # the outer entry is not read
                cached(_Cfg(a=5), build, name="fresh")  # computed inside
                if raises:
                    raise RuntimeError("boom")
        assert {n: os.environ.get(n) for n in before} == before
        assert not inner.exists()  # the block's cache is gone with it
    assert len(calls) == (5 if was_set else 4)  # nothing read across the boundary
    if was_set:
        assert [p.name.startswith("fresh-") for p in outer.iterdir()] == [True]
        cached(_Cfg(), build, name="fresh")  # the outer entry, read
        assert len(calls) == 5
        cached(_Cfg(a=5), build, name="fresh")  # not seen outside: computed again
        assert len(calls) == 6


def test_cache_write_is_atomic(tmp_path, monkeypatch):
    """Interrupt torch.save halfway: the entry must not exist afterwards."""
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    real_save = torch.save

    def exploding_save(obj, f, *a, **k):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", exploding_save)
    with pytest.raises(KeyboardInterrupt):
        cached(_Cfg(a=5), lambda: {"w": torch.ones(2)}, name="demo")
    monkeypatch.setattr(torch, "save", real_save)
    assert list(tmp_path.iterdir()) == []


def test_train_scheduled_follows_the_schedule_and_calls_back():
    from fmlab.train import train_scheduled

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    start = model.weight.detach().clone()
    seen = []

    def step_loss(s):
        return ((model(x) - y) ** 2).mean()

    # a factor of 0 on every step: the weights never move, the callback still runs
    train_scheduled(
        model,
        step_loss,
        steps=6,
        lr=0.1,
        optimizer="sgd",
        lr_factor=lambda s: 0.0,
        every=2,
        callback=seen.append,
    )
    assert torch.equal(model.weight, start) and seen == [2, 4, 6]
    before = float(step_loss(0))
    train_scheduled(
        model, step_loss, steps=20, lr=0.1, optimizer="sgd", lr_factor=lambda s: 1.0
    )
    assert float(step_loss(0)) < before
    with pytest.raises(ValueError, match="optimizer"):
        train_scheduled(
            model, step_loss, steps=1, lr=0.1, optimizer="rmsprop", lr_factor=float
        )


# -- the cache: dataclasses and the code fingerprint -------------------------------
@dataclass(frozen=True)
class _Inner:
    values: torch.Tensor
    label: str


@dataclass(frozen=True)
class _Result:
    inner: _Inner
    by_key: dict
    numbers: tuple


def test_cached_returns_result_dataclasses(tmp_path, monkeypatch):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    calls = []

    def build():
        calls.append(1)
        return _Result(_Inner(torch.arange(3.0), "a"), {"x": [1, 2]}, (0.5, 2))

    first = cached({"k": 1}, build, name="demo")
    again = cached({"k": 1}, build, name="demo")
    assert len(calls) == 1 and isinstance(again, _Result)
    assert isinstance(again.inner, _Inner) and again.inner.label == "a"
    assert torch.equal(again.inner.values, first.inner.values)
    assert again.by_key == {"x": [1, 2]} and again.numbers == (0.5, 2)


def test_code_fingerprint_follows_the_code(tmp_path):
    """Editing a copy of the package changes the fingerprint of the chapters it feeds:
    a core edit changes every chapter's, a chapter edit only that chapter's, and a
    figure module or the claims module changes the pages' outputs, not the results."""
    pkg = tmp_path / "fmlab"
    shutil.copytree(
        Path(fmlab.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__")
    )
    before = {c: code_fingerprint(c, root=pkg) for c in ("ch1", "ch4", None)}
    assert before == {c: code_fingerprint(c, root=pkg) for c in before}
    ch4 = next((pkg / "chapters").glob("ch4_kernel*.py"))
    ch4.write_text(ch4.read_text() + "\n# an edit\n")
    after = {c: code_fingerprint(c, root=pkg) for c in before}
    assert after["ch4"] != before["ch4"] and after[None] != before[None]
    assert after["ch1"] == before["ch1"]
    drawn = code_fingerprint("ch4", outputs=True, root=pkg)
    (pkg / "chapters" / "ch4_figures.py").write_text("# drawing only\n")
    (pkg / "claims.py").write_text((pkg / "claims.py").read_text() + "\n# judging\n")
    assert code_fingerprint("ch4", root=pkg) == after["ch4"]  # results: unchanged
    assert code_fingerprint("ch4", outputs=True, root=pkg) != drawn  # the page: not
    (pkg / "train.py").write_text((pkg / "train.py").read_text() + "\n# core edit\n")
    assert code_fingerprint("ch1", root=pkg) != before["ch1"]
    with pytest.raises(ValueError, match="chapter"):
        code_fingerprint("four")
    with pytest.raises(ValueError, match="ch9"):
        code_fingerprint("ch9", root=pkg)


# A package whose imports are known: (path, source) of each module.
_TOY_PACKAGE = {
    "__init__.py": "from .claims import claim\nfrom .train import fit\n",
    "claims.py": "import json\n",
    "viz.py": "",
    "stored.py": "from .repro import seed\n",
    "train.py": "from fmlab.repro import seed\n",
    "repro.py": "",
    "lonely.py": "",
    "theory/__init__.py": "",
    "theory/mid.py": "def f():\n    from . import deep, name\n",
    "theory/deep.py": "",
    "data/__init__.py": "from .base import D\n",
    "data/base.py": "",
    "data/extra.py": "",
    "chapters/__init__.py": "",
    "chapters/ch1_a.py": (
        "from ..theory import mid\nimport fmlab.data\nfrom .. import stored\n"
    ),
    "chapters/ch1_figures.py": "from ..viz import table\nfrom ..data import extra\n",
    "chapters/ch2_b.py": "from fmlab.data.extra import y\n",
}


def _toy_package(tmp_path) -> Path:
    pkg = tmp_path / "fmlab"
    for rel, source in _TOY_PACKAGE.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(source)
    return pkg


def test_import_closure_reads_every_kind_of_import(tmp_path):
    """Relative, absolute and function-level imports, ``from . import x`` of a module
    (and not of a mere name), and the ``__init__.py`` of every package on the way."""
    pkg = _toy_package(tmp_path)
    a = pkg / "chapters" / "ch1_a.py"
    assert set(package_imports(a, pkg)) == {
        (1, ("theory",)),
        (1, ("theory", "mid")),
        (2, ("data",)),
        (3, ()),
        (3, ("stored",)),
    }
    assert package_imports(pkg / "theory" / "mid.py", pkg) == [
        (2, ("theory",)),
        (2, ("theory", "deep")),
    ]

    def closure(*paths, skip=None):
        found = import_closure([pkg / p for p in paths], pkg, skip=skip)
        return {p.relative_to(pkg).as_posix() for p in found}

    core = {"__init__.py", "claims.py", "train.py", "repro.py", "chapters/__init__.py"}
    ch1 = {"chapters/ch1_a.py", "theory/__init__.py", "theory/mid.py"}
    ch1 |= {"theory/deep.py", "data/__init__.py", "data/base.py", "stored.py"}
    assert closure("chapters/ch1_a.py") == core | ch1
    assert closure("chapters/ch1_a.py", skip=lambda rel: rel == "stored.py") == (
        core | ch1
    ) - {"stored.py"}
    assert closure("chapters/ch2_b.py") == core | {
        "chapters/ch2_b.py",
        "data/__init__.py",
        "data/base.py",
        "data/extra.py",
    }
    with pytest.raises(ValueError, match="paths"):
        import_closure([tmp_path / "elsewhere.py"], pkg)


def test_code_fingerprint_keys_on_the_import_closure(tmp_path):
    """An edit changes the key of exactly the chapters whose modules import the edited
    one, directly or transitively; ``stored.py``, ``claims.py``, ``viz.py`` and a
    chapter's figures enter its outputs key only."""
    pkg = _toy_package(tmp_path)
    keys = [(c, o) for c in ("ch1", "ch2", None) for o in (False, True)]

    def edit(rel):
        before = {k: code_fingerprint(k[0], outputs=k[1], root=pkg) for k in keys}
        (pkg / rel).write_text((pkg / rel).read_text() + "# an edit\n")
        after = {k: code_fingerprint(k[0], outputs=k[1], root=pkg) for k in keys}
        return {k for k in keys if after[k] != before[k]}

    whole = {(None, False), (None, True)}  # the package, results and outputs
    shown = {(None, True)}  # the package's outputs only
    assert edit("lonely.py") == whole  # imported by nobody
    assert edit("theory/deep.py") == whole | {("ch1", False), ("ch1", True)}
    assert edit("data/extra.py") == whole | {("ch2", False), ("ch2", True)} | {
        ("ch1", True)  # through ch1's figures
    }
    assert edit("data/__init__.py") == whole | {k for k in keys if k[0]}
    assert edit("stored.py") == shown | {("ch1", True)}
    assert edit("claims.py") == shown | {("ch1", True), ("ch2", True)}
    assert edit("viz.py") == shown | {("ch1", True)}
    assert edit("chapters/ch1_figures.py") == shown | {("ch1", True)}
    assert edit("repro.py") == set(keys)


def test_cached_logs_what_it_computed_and_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("FMLAB_CACHE_DIR", str(tmp_path))
    log = tmp_path / "use.log"
    monkeypatch.setenv("FMLAB_CACHE_LOG", str(log))
    cached(_Cfg(a=3), lambda: {"w": torch.ones(2)}, name="demo")
    cached(_Cfg(a=3), lambda: {"w": torch.ones(2)}, name="demo")
    assert log.read_text().splitlines() == ["computed demo", "loaded demo"]
    monkeypatch.delenv("FMLAB_CACHE_LOG")
    cached(_Cfg(a=3), lambda: {"w": torch.ones(2)}, name="demo")  # no log: no line
    assert len(log.read_text().splitlines()) == 2
