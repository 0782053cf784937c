"""Page 03's nonlinear experiment, stored (Chapter 3).

Page 03 runs :func:`fmlab.chapters.ch3_lpft.run_lpft_experiment` at two overlap angles
on ten worlds (75° and 45°) and at three more on three worlds (the overlap sweep, 60°,
70° and 90°): 29 pretrained encoders, each adapted by LP, FT, LP-FT and the scratch
baseline over their grids, about 140 s of one core on an idle machine and more than the
page's budget. ``scripts/ch3_lpft.py`` runs those five experiments once, exactly as the
page would at seed offset 0 (one thread, a fresh model cache), into
``results/ch3_lpft.json``: each experiment's config and its whole result (every tensor
that :func:`~fmlab.chapters.ch3_lpft.run_lpft_experiment` returns, to the last bit),
with the fingerprint of the code that computes them (:mod:`fmlab.stored`).

:func:`stored_result` is the switch: at seed offset 0, an experiment whose
:class:`~fmlab.chapters.ch3_lpft.LPFTConfig` is exactly one of the stored ones is read
from the file by :func:`~fmlab.chapters.ch3_lpft.run_lpft_experiment` instead of
being computed; at any other seed offset or config it is computed as before. A stored
file whose code has changed raises :class:`fmlab.stored.StaleResults`, naming the
script. The file also keeps a slice (:data:`LPFT_SLICE`: the same experiment on three
small worlds with short grids and a few steps), which the tests rerun under another
rounding path.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from .. import stored
from ..repro import seed_offset, single_threaded
from ..train import fresh_model_cache
from . import ch3_lpft

__all__ = [
    "LPFT_RESULTS",
    "LPFT_SCRIPT",
    "LPFT_SLICE",
    "config_record",
    "lpft_config",
    "lpft_job_check",
    "lpft_run",
    "lpft_slice",
    "lpft_results",
    "lpft_sources",
    "lpft_slice_config",
    "stored_result",
]

LPFT_RESULTS = Path(__file__).parent / "results" / "ch3_lpft.json"
LPFT_SCRIPT = "scripts/ch3_lpft.py"

#: The slice the tests rerun (under another rounding path than the record's): the
#: experiment in the page's kind of world (the config's default, the page's world at
#: 75°) on three worlds, with short grids, short pretraining and fine-tuning and small
#: evaluation sets; about a second of one core.
LPFT_SLICE = dict(
    pretrain_steps=20,
    n_train=128,
    n_val=400,
    n_test=400,
    n_track=100,
    ft_steps=15,
    track_every=5,
    scratch_steps=15,
    lrs=(1e-4, 1e-3, 1e-2),
    l2s=(1e-4, 1e-2),
    scratch_lrs=(1e-3, 1e-2),
    seeds=(0, 1, 2),
)


def config_record(cfg: ch3_lpft.LPFTConfig) -> dict:
    """``cfg`` as plain JSON data, with the class of its world (the key by which a
    stored experiment is found)."""
    if not isinstance(cfg, ch3_lpft.LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    data = json.loads(json.dumps(dataclasses.asdict(cfg)))
    data["world"]["class"] = type(cfg.world).__name__
    return data


def lpft_config(record: dict) -> ch3_lpft.LPFTConfig:
    """The :class:`~fmlab.chapters.ch3_lpft.LPFTConfig` of a config record (the
    inverse of :func:`config_record`; a world without ``"class"`` is a
    :class:`~fmlab.data.shift.StyleShiftConfig`)."""
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    world = dict(record["world"])
    kind = world.pop("class", "StyleShiftConfig")
    classes = {
        "StyleShiftConfig": ch3_lpft.StyleShiftConfig,
        "SharedStyleConfig": ch3_lpft.SharedStyleConfig,
    }
    values["world"] = classes[kind](**world)
    return ch3_lpft.LPFTConfig(**values)


def _encode(result: dict) -> dict:
    """A result of :func:`~fmlab.chapters.ch3_lpft.run_lpft_experiment` as JSON data
    (tensors by :func:`fmlab.stored.encode_tensors`, exact; numbers as they are)."""
    return {
        k: {"number": v} if isinstance(v, (int, float)) else stored.encode_tensors(v)
        for k, v in result.items()
    }


def _decode(data: dict) -> dict:
    return {
        k: v["number"] if set(v) == {"number"} else stored.decode_tensors(v)
        for k, v in data.items()
    }


def lpft_slice_config() -> ch3_lpft.LPFTConfig:
    """The slice's config: :data:`LPFT_SLICE` on the defaults of
    :class:`~fmlab.chapters.ch3_lpft.LPFTConfig`."""
    return ch3_lpft.LPFTConfig(**LPFT_SLICE)


def lpft_run(config: ch3_lpft.LPFTConfig) -> dict:
    """Compute the experiment of ``config`` as the page does (at seed offset 0, on one
    thread, from a fresh model cache) and return it as plain data for JSON:
    ``{"config": config_record(config), "result": ...}``."""
    with fresh_model_cache(), single_threaded():
        result = ch3_lpft._lpft_results(config)
    return {"config": config_record(config), "result": _encode(result)}


def lpft_slice(record: dict | None = None) -> dict:
    """Run the slice (the config ``record``, by default :data:`LPFT_SLICE` on the
    defaults of :class:`~fmlab.chapters.ch3_lpft.LPFTConfig`): per world (the
    replicates, first axis) the quantities that :func:`fmlab.stored.compare_runs`
    compares: the pretraining loss, the chosen probe's training loss, the feature norm
    of the ID test inputs, LP-FT's final training loss and ID feature change at every
    rate, and FT's final training loss at every searched rate."""
    config = lpft_slice_config() if record is None else lpft_config(record)
    with fresh_model_cache(), single_threaded():
        res = ch3_lpft._lpft_results(config)
    ft = ch3_lpft.searched(config, "ft")
    return {
        "pretrain_loss": res["pretrain_loss"].tolist(),
        "lp_train_loss": res["lp_train_loss"].tolist(),
        "feature_norm_id": res["feature_norm_id"].tolist(),
        "lpft_train_loss": res["trace"]["lpft"][:, :, -1, 0].tolist(),
        "lpft_change_id": res["change"]["lpft"][:, :, 0].tolist(),
        "ft_train_loss": res["trace"]["ft"][:, ft, -1, 0].tolist(),
    }


#: The numbers of an experiment's result without a world axis (a rerun gives them bit
#: for bit): the world's overlap and the steps of the traces.
_WHOLE_RUN_FIELDS = ("overlap", "trace_steps")


def _per_world(result: dict, n_worlds: int) -> dict:
    """Every quantity of a (decoded) result with a world axis, flat per world:
    ``{"<key>" or "<key>|<method>": (worlds, values) float64 tensor}``."""
    import torch

    out = {}
    for key, value in result.items():
        if key in _WHOLE_RUN_FIELDS:
            continue
        parts = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in parts:
            name = key if sub is None else f"{key}|{sub}"
            if not isinstance(v, torch.Tensor) or v.ndim == 0 or len(v) != n_worlds:
                raise ValueError(f"{name}: expected one row per world ({n_worlds})")
            out[name] = v.reshape(n_worlds, -1).double()
    return out


def lpft_job_check(path: Path | str | None = None, angle: float = 60.0) -> dict:
    """A script's ``--restamp`` check: rerun the stored experiment at overlap angle
    ``angle`` (by default 60°, the first of the overlap sweep: three worlds, each
    pretrained and adapted by every method over its grid, about 5 s of one core) with
    today's code, as the script ran it (:func:`lpft_run`: seed offset 0, one thread, a
    fresh model cache), and compare every per-world number of its result with the
    record (:func:`fmlab.stored.compare_runs`): accuracies, chosen values, every
    grid's sweep, FT's heads, feature changes, traces, span residuals, probe and
    pretraining losses, feature norms. A number undefined in a world (nan: a rate FT
    does not search, a run that diverged) must be nan in the same places, and the
    numbers without a world axis (the overlap, the trace's steps) the same bit for
    bit. Reads the file without checking its fingerprint.

    Run it on the record's rounding path (:func:`fmlab.stored.environment` of the run's
    origin; for today's file, written on an AVX2 machine, ``ATEN_CPU_CAPABILITY=avx2``
    on a newer one): there a change that moves nothing reproduces the record bit for
    bit. On another path the numbers at rounding level (the span residuals, the
    feature change at step 0, exactly 0 in the record) can fail the rule, and the
    check then asks for a rerun of the whole run."""
    import numpy as np
    import torch

    data = stored.read(LPFT_RESULTS if path is None else path)
    angles = [run["config"]["world"]["overlap_deg"] for run in data["runs"]]
    if angles.count(angle) != 1:
        raise ValueError(
            f"angle must be one of the stored experiments' {angles}, got {angle!r}"
        )
    run = data["runs"][angles.index(angle)]
    config = lpft_config(run["config"])
    if config_record(config) != run["config"]:
        raise ValueError("the stored config does not read back as it was written")
    old, new = _decode(run["result"]), _decode(lpft_run(config)["result"])
    if set(old) != set(new):
        raise ValueError(f"the rerun gives {sorted(new)}, the record {sorted(old)}")

    def equal(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.equal(b)
        return type(a) is type(b) and a == b

    same = all(equal(old[k], new[k]) for k in _WHOLE_RUN_FIELDS if k in old)
    worlds = len(config.seeds)
    old_w, new_w = _per_world(old, worlds), _per_world(new, worlds)
    record, rerun = {}, {}
    for name, o in old_w.items():
        n = new_w[name]
        if o.shape != n.shape:
            raise ValueError(f"{name}: rerun {tuple(n.shape)}, record {tuple(o.shape)}")
        # the values defined in every world of both runs are compared by the rule;
        # the rest must be the same, nan where nan
        defined = o.isfinite().all(0) & n.isfinite().all(0)
        rest = ~defined
        same = same and np.array_equal(
            o[:, rest].numpy(), n[:, rest].numpy(), equal_nan=True
        )
        if defined.any():
            record[name], rerun[name] = o[:, defined], n[:, defined]
    res = stored.compare_runs(record, rerun)
    res["ok"] = bool(res["ok"] and same)
    res["bitwise"] = bool(res["bitwise"] and same)
    return res


def lpft_sources() -> list:
    """The package code that computes the stored experiments, for their fingerprint
    (:mod:`fmlab.stored`); the script's settings are in the file as its configs."""
    from ..data import shift
    from ..models import mlp
    from ..repro import _splitmix64, effective_seed, make_generator, seed_everything

    m = ch3_lpft
    return [
        config_record,
        lpft_config,
        lpft_run,
        lpft_slice,
        lpft_slice_config,
        fresh_model_cache,
        _encode,
        _decode,
        m.LPFTConfig,
        m.SharedStyleConfig,
        m.SharedStyleWorld,
        m.make_world,
        m.searched,
        m.at_angle,
        m.build_encoder,
        m._linears,
        m.pretrain_encoders,
        m._soft_targets,
        m._softmax_objective,
        m.softmax_regression,
        m.linear_head,
        m.random_head,
        m._mlp_layers,
        m.fine_tune_batch,
        m._row_space,
        m.select_by_validation,
        m._tolerance,
        m._conservative_order,
        m._span_features,
        m._span_residual,
        m._hits,
        m._lpft_results,
        m.run_lpft_experiment,
        m.overlap_sweep,
        make_generator,
        effective_seed,
        _splitmix64,  # effective_seed's mixer
        seed_everything,
        shift,
        mlp,
    ]


def lpft_results(path: Path | str | None = None) -> dict | None:
    """The stored experiments (``{"meta", "runs": [per experiment: config, result],
    "stored"}``, as written), or None when the file is absent. Raises
    :class:`fmlab.stored.StaleResults`, naming the script, when the code that computes
    them has changed since."""
    path = Path(LPFT_RESULTS if path is None else path)
    if not path.exists():
        return None
    return stored.load_cached(path, script=LPFT_SCRIPT, sources=lpft_sources())


@functools.lru_cache(maxsize=4)
def _stored_configs(path: str, mtime_ns: int) -> list:
    return [run["config"] for run in stored.read(path)["runs"]]


def stored_result(cfg: ch3_lpft.LPFTConfig, path=None) -> dict | None:
    """The stored result of ``cfg`` (as
    :func:`~fmlab.chapters.ch3_lpft.run_lpft_experiment` returns it) when the seed
    offset is 0 and ``cfg`` is exactly the config of a stored experiment; else None
    (the experiment is to be computed). Raises :class:`fmlab.stored.StaleResults`
    when ``cfg`` is stored but the code that computes it has changed since."""
    path = Path(LPFT_RESULTS if path is None else path)
    if seed_offset() != 0 or not path.exists():
        return None
    configs = _stored_configs(str(path), path.stat().st_mtime_ns)
    want = config_record(cfg)
    if want not in configs:
        return None
    return _decode(lpft_results(path)["runs"][configs.index(want)]["result"])
