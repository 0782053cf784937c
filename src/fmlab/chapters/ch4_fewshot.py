"""Chapter 4, the few-shot runs: prompt-based and standard fine-tuning against their
kernel analogs over shots and seeds, every hyperparameter chosen on validation data
(:func:`run_kernel_experiment`, :func:`few_shot_runs`), and the grids they search.

:mod:`fmlab.chapters.ch4_kernel_view` describes the chapter and holds its pages'
runners.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.func import functional_call, vmap
from torch.nn import functional as F

from .._validate import check_choice, check_float, check_int
from ..data.sentiment_language import SentimentLanguage
from ..models.transformer import (
    CLSClassifier,
    PromptClassifier,
)
from ..repro import seed_everything
from ..train import cached, progress
from .ch4_kernel_behaviour import (
    _kernel_fits,
    _mean_diag,
    kernel_behaviour,
    same_steps_outputs,
    signgd_same_steps_outputs,
    start_measures,
)
from .ch4_world import (
    FineTuneDiverged,
    LogisticFineTuneConfig,
    MLMPretrainConfig,
    _scored,
    _select,
    cross_validated_probe_head,
    few_shot_task,
    fine_tune_logistic,
    logistic_probe_head,
    outputs,
    pretrain_masked_lm,
    sign_accuracy,
    test_set,
)

__all__ = [
    "KernelExperimentConfig",
    "KernelExperiment",
    "run_kernel_experiment",
    "lazy_grid",
    "wide_grid",
    "FewShotRuns",
    "few_shot_runs",
    "METHODS",
]


# -- the experiment of the chapter
# ------------------------------------------------------------
@dataclass(frozen=True)
class KernelExperimentConfig:
    """Few-shot fine-tuning vs its kernel analogs, over shots and seeds.

    Each run (a number of shots ``k`` and a seed) draws ``k`` training and ``k``
    validation examples per class. Fine-tuning takes ``steps`` full-batch steps. The SGD
    learning rate is :math:`\\eta = c / \\bar K`, with :math:`\\bar K` the mean of
    :math:`K(x_i, x_i)` over the training set in that setting (LoRA uses its own kernel)
    and :math:`c` chosen among ``sgd_lr_scales`` on the validation set; Adam's among
    ``adam_lrs``; the kernel ridge :math:`\\lambda` (relative to :math:`\\bar K`) among
    ``kernel_regs``; the ridge of the linear probe that the standard head starts from,
    and of the bag-of-words baseline, among ``probe_regs``. Ties in validation accuracy
    go to the lower validation loss. ``methods="sgd"`` runs only SGD fine-tuning and the
    eNTK in both settings, the linear probe and the bag of words (no Adam, LoRA or
    SignGD kernels), for the larger ``k`` where those are the comparisons that matter.

    ``analog_lr_scale`` (with ``analog_adam_lr`` and ``analog_signgd_reg``), when set,
    also records each run's fine-tuning at that fixed hyperparameter beside its own
    kernel analogs, with no validation choice: SGD at :math:`c` against the eNTK trained
    by the same ``T = steps`` gradient steps in function space (its step-matched analog,
    in both settings) and against the eNTK at ridge :math:`1/(cT)` (a ridge standing in
    for the stopping time), and Adam at ``analog_adam_lr`` against the asymmetric SignGD
    kernel at ridge ``analog_signgd_reg``. They must be in the grids, since the recorded
    numbers are those grid candidates.

    ``wide_scales`` with ``wide_checkpoints`` add the paper's wide search to SGD-FT in
    both settings: runs at each scale :math:`c`, read at each checkpoint (a step
    count), join the grid's runs, and the validated choice among all of them is
    recorded as ``"SGD-FT, wide grid"`` (its scale and step count in ``chosen``).

    ``standard_head`` is where the standard setting's head starts: ``"random"``,
    :math:`\\Gamma \\sim \\mathcal N(0, I/d)` drawn from the run's seed and
    :math:`c = 0` (a fresh head, whose output derivative does not vanish: Remark 5.4
    of the paper), ``"probe"``, the linear-probing solution on the run's training
    set (its ridge chosen on the validation set), or ``"cv_probe"``, the paper's own
    start (its footnote 2): the probe cross-validated on the training examples only,
    scaled as the authors' code scales it
    (:func:`~.ch4_world.cross_validated_probe_head`; its test accuracy and :math:`C`
    recorded as ``"CV probe"``). The probe is fitted and scored (``"LP"``) either way.

    ``signgd_batch1_scale`` :math:`c`, when set (with ``methods="all"``), also records
    a prompt-based SignGD run on one example per step, ``signgd_batch1_passes`` passes
    over the training set with :math:`\\eta = c / \\overline{\\lVert g(x_i)\\rVert_1}`
    (a step moves its own example's output by about :math:`c`), beside its
    step-matched asymmetric SignGD kernel analog (Theorem 4.3 is a statement about one
    example per step): ``"SignGD-FT, batch 1"`` and ``"K-A-SignGD, same steps"``.
    """

    shots: tuple[int, ...] = (4, 16)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    n_test: int = 400
    steps: int = 30
    sgd_lr_scales: tuple[float, ...] = (2.0, 8.0, 32.0)
    adam_lrs: tuple[float, ...] = (1e-4, 3e-4, 1e-3)
    lora_rank: int = 8
    kernel_regs: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0)
    probe_regs: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0)
    methods: str = "all"
    analog_lr_scale: float | None = None
    analog_adam_lr: float = 5e-5
    analog_signgd_reg: float = 1 / 240
    wide_scales: tuple[float, ...] = ()
    wide_checkpoints: tuple[int, ...] = ()
    standard_head: str = "random"
    signgd_batch1_scale: float | None = None
    signgd_batch1_passes: int = 2

    def __post_init__(self):
        for name in (
            "shots",
            "seeds",
            "sgd_lr_scales",
            "adam_lrs",
            "kernel_regs",
            "probe_regs",
        ):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty tuple")
        for k in self.shots:
            check_int("shots", k, minimum=1)
        for s in self.seeds:
            check_int("seeds", s, minimum=0)
        check_int("n_test", self.n_test, minimum=2)
        check_int("steps", self.steps, minimum=1)
        for name in ("sgd_lr_scales", "adam_lrs", "kernel_regs", "probe_regs"):
            for v in getattr(self, name):
                check_float(name, v, minimum=0.0, strict_min=True)
        check_int("lora_rank", self.lora_rank, minimum=1)
        check_choice("methods", self.methods, ("all", "sgd"))
        check_choice(
            "standard_head", self.standard_head, ("random", "probe", "cv_probe")
        )
        if self.signgd_batch1_scale is not None:
            check_float("signgd_batch1_scale", self.signgd_batch1_scale, minimum=0.0)
        check_int("signgd_batch1_passes", self.signgd_batch1_passes, minimum=1)
        if not isinstance(self.wide_scales, tuple) or not isinstance(
            self.wide_checkpoints, tuple
        ):
            raise ValueError("wide_scales and wide_checkpoints must be tuples")
        if bool(self.wide_scales) != bool(self.wide_checkpoints):
            raise ValueError(
                "wide_scales and wide_checkpoints must be given together, got "
                f"{self.wide_scales} and {self.wide_checkpoints}"
            )
        for v in self.wide_scales:
            check_float("wide_scales", v, minimum=0.0, strict_min=True)
        for t in self.wide_checkpoints:
            check_int("wide_checkpoints", t, minimum=1)
        if self.analog_lr_scale is not None:
            if self.analog_lr_scale not in self.sgd_lr_scales:
                raise ValueError(
                    f"analog_lr_scale {self.analog_lr_scale} must be one of "
                    f"sgd_lr_scales {self.sgd_lr_scales}"
                )
            self.analog_reg("sgd")  # raises when the analog ridge is not in the grid
            if self.methods == "all":
                if self.analog_adam_lr not in self.adam_lrs:
                    raise ValueError(
                        f"analog_adam_lr {self.analog_adam_lr} must be one of "
                        f"adam_lrs {self.adam_lrs}"
                    )
                self.analog_reg("asymmetric_signgd")

    def analog_reg(self, kernel: str) -> float:
        """The entry of ``kernel_regs`` that is the kernel analog of the fixed
        fine-tuning run: :math:`1/(cT)` for the eNTK, ``analog_signgd_reg`` for the
        asymmetric SignGD kernel."""
        target = (
            1.0 / (self.analog_lr_scale * self.steps)
            if kernel == "sgd"
            else self.analog_signgd_reg
        )
        for reg in self.kernel_regs:
            if math.isclose(reg, target, rel_tol=1e-9):
                return reg
        raise ValueError(
            f"kernel_regs {self.kernel_regs} must contain the {kernel} analog ridge "
            f"{target:.6g}"
        )


#: The methods of :func:`run_kernel_experiment`, by setting.
METHODS = {
    "prompt": (
        "zero-shot",
        "SGD-FT",
        "K-SGD",
        "Adam-FT",
        "K-A-SignGD",
        "K-SignGD",
        "LoRA-SGD-FT",
    ),
    "standard": ("LP", "SGD-FT", "K-SGD"),
    "bag of words": ("LR",),
}


@dataclass
class KernelExperiment:
    """Results of :func:`run_kernel_experiment`.

    ``accuracy[(setting, method, k)]`` is a list over seeds of test accuracies (settings
    and methods as in :data:`METHODS`); ``chosen[(setting, method, k)]`` the
    hyperparameter picked on validation data, per seed. ``dynamics[(setting, optimizer,
    k)]`` (optimizers ``"SGD"``, ``"Adam"``) is a dict of lists over seeds with
    ``acc0``, ``acc_ft``, ``acc_lin``, ``gain_recovered``, ``lin_error`` and
    ``kernel_change`` (see :func:`kernel_behaviour`) of the chosen run;
    ``by_lr[(setting, k)]`` holds ``lin_error`` and ``kernel_change`` for every SGD
    learning-rate scale (a list over seeds of lists over ``sgd_lr_scales``).
    ``example[setting]`` holds the test outputs ``f0``, ``f_lin`` and ``f_ft`` (one per
    learning-rate scale) of the first seed at the largest ``k``, for the figures.
    """

    config: KernelExperimentConfig
    accuracy: dict = field(default_factory=dict)
    chosen: dict = field(default_factory=dict)
    dynamics: dict = field(default_factory=dict)
    by_lr: dict = field(default_factory=dict)
    example: dict = field(default_factory=dict)
    diverged: dict = field(default_factory=dict)


_DYNAMICS = (
    "acc0",
    "acc_ft",
    "acc_lin",
    "gain_recovered",
    "lin_error",
    "kernel_change",
)


def _fine_tune_stacked(model0, x, y, optimizer, lrs, checkpoints):
    """Full-batch fine-tuning of ``model0`` on the logistic loss at every learning
    rate of ``lrs`` at once, as one batched model (the parameter sets stacked along a
    first axis, :func:`torch.func.vmap` over :func:`torch.func.functional_call`): the
    same steps as :func:`~.ch4_world.fine_tune_logistic` with ``batch_size=None`` run
    once per rate (``optimizer`` ``"sgd"`` or ``"adam"``, torch's defaults), in one
    pass of Python per step instead of one per run. Run ``i`` is read after each step
    count in ``checkpoints[i]`` (its largest is its number of steps).

    Returns ``(reads, diverged)``: per run, ``{t: parameters}`` (the trainable ones by
    name) for each checkpoint reached with finite weights and a finite loss on the
    training set, and whether the run diverged (a non-finite loss at a step, or a
    checkpoint that was not finite): it then leaves the stack, keeping its earlier
    checkpoints, and the other runs go on unchanged."""
    names = [n for n, p in model0.named_parameters() if p.requires_grad]
    theta0 = {n: p.detach() for n, p in model0.named_parameters()}
    frozen = {n: p for n, p in theta0.items() if n not in names}
    frozen.update(dict(model0.named_buffers()))

    def f(params, x):
        return functional_call(model0, {**params, **frozen}, (x,))

    call = vmap(f, in_dims=(0, None))
    runs = len(lrs)
    stops = [sorted({int(t) for t in c}) for c in checkpoints]
    params = {n: theta0[n].expand(runs, *theta0[n].shape).clone() for n in names}
    moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
    rate = torch.tensor([float(lr) for lr in lrs], dtype=theta0[names[0]].dtype)
    live = list(range(runs))  # the runs in the stack, in order
    reads, diverged = [{} for _ in range(runs)], [False] * runs

    def keep(rows):  # the stack without the runs that left it
        nonlocal params, moments, rate, live
        index = torch.tensor(rows, dtype=torch.long)
        params = {n: p[index] for n, p in params.items()}
        moments = {n: (m[index], v[index]) for n, (m, v) in moments.items()}
        rate, live = rate[index], [live[r] for r in rows]

    def shaped(r, p):  # a rate per run, broadcast over its parameter
        return r.view(-1, *([1] * (p.ndim - 1)))

    beta1, beta2, eps = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults
    for step in range(max(s[-1] for s in stops)):
        leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
        losses = F.softplus(-y * call(leaves, x)).mean(1)
        finite = torch.isfinite(losses).tolist()
        if not any(finite):
            for i in live:
                diverged[i] = True
            break
        grads = torch.autograd.grad(  # a parameter the output never reads stays
            losses[torch.tensor(finite)].sum(),
            list(leaves.values()),
            allow_unused=True,
        )
        with torch.no_grad():
            for (n, p), g in zip(leaves.items(), grads):
                if g is None:
                    continue
                if optimizer == "sgd":
                    params[n] = p - shaped(rate, p) * g
                    continue
                m, v = moments[n]
                m = m.lerp(g, 1 - beta1)
                v = v * beta2 + (1 - beta2) * g * g
                moments[n] = (m, v)
                c1, c2 = 1 - beta1 ** (step + 1), (1 - beta2 ** (step + 1)) ** 0.5
                denom = v.sqrt() / c2 + eps
                params[n] = p - shaped(rate / c1, p) * m / denom
            t = step + 1
            due = [r for r, i in enumerate(live) if finite[r] and t in stops[i]]
            if due:  # a checkpoint must be finite, and so its loss
                loss_t = F.softplus(-y * call(params, x)).mean(1)
                ok = torch.isfinite(loss_t)
                for p in params.values():
                    ok &= torch.isfinite(p).flatten(1).all(1)
                for r in due:
                    if bool(ok[r]):
                        reads[live[r]][t] = {n: p[r] for n, p in params.items()}
                    else:
                        finite[r] = False
        for r, i in enumerate(live):
            diverged[i] = diverged[i] or not finite[r]
        rows = [r for r, i in enumerate(live) if finite[r] and t < stops[i][-1]]
        if not rows:
            break
        if len(rows) < len(live):
            keep(rows)
    return reads, diverged


def _tuned(model0, params):
    """A copy of ``model0`` with the trainable parameters ``params`` (by name)."""
    tuned = copy.deepcopy(model0)
    with torch.no_grad():
        for n, p in tuned.named_parameters():
            if n in params:
                p.copy_(params[n])
    return tuned.eval()


@torch.no_grad()
def _stacked_outputs(model0, reads, x):
    """The outputs on ``x`` of ``model0`` with each parameter set of ``reads`` (a
    list), ``(len(reads), n)``, in one batched call."""
    frozen = {n: p.detach() for n, p in model0.named_parameters() if n not in reads[0]}
    frozen.update(dict(model0.named_buffers()))
    stacked = {n: torch.stack([r[n] for r in reads]) for n in reads[0]}

    def f(params, x):
        return functional_call(model0, {**params, **frozen}, (x,))

    return vmap(f, in_dims=(0, None))(stacked, x)


def _fine_tune_grid(
    model0, data, x_key, optimizer, grid, steps, *, dynamics=None, wide=()
):
    """Fine-tune ``model0`` at every ``(value, lr)`` of ``grid`` for ``steps``
    full-batch steps, and each wide run ``(scale, lr, checkpoints)``, all at once
    (:func:`_fine_tune_stacked`); return the grid's candidates scored on the
    validation set (one per entry of ``grid``; a diverged one scores worst and is
    marked), with their test outputs and kernel behaviour when ``dynamics`` (a dict of
    Jacobians and outputs at theta_0) is given, else with their parameters
    (:func:`_test_outputs` reads the test set for the few that need it); the wide runs'
    candidates, one per checkpoint reached (``scale``, ``steps``, parameters); and the
    number of wide runs that diverged."""
    x, y = getattr(data["train"], x_key), data["train"].y
    lrs = [lr for _, lr in grid] + [lr for _, lr, _ in wide]
    stops = [(steps,)] * len(grid) + [c for _, _, c in wide]
    reads, diverged = _fine_tune_stacked(model0, x, y, optimizer, lrs, stops)
    flat = [(i, t, p) for i, r in enumerate(reads) for t, p in sorted(r.items())]
    f_val = (
        _stacked_outputs(model0, [p for _, _, p in flat], getattr(data["val"], x_key))
        if flat
        else None
    )
    val = {(i, t): f_val[row] for row, (i, t, _) in enumerate(flat)}
    cands = []
    for i, (value, _) in enumerate(grid):
        if steps not in reads[i]:  # diverged: dropped and counted
            cand = {"val_acc": -1.0, "val_loss": math.inf, "value": value}
            cand["diverged"] = True
            f_te = torch.zeros(data["test"].y.shape[0])
            cand["test"] = f_te
            if dynamics is not None:
                nan = float("nan")
                cand["stats"] = {
                    **{m: nan for m in _DYNAMICS},
                    "f0": dynamics["f0_te"],
                    "f_ft": f_te,
                    "f_lin": f_te,
                }
            cands.append(cand)
            continue
        params = reads[i][steps]
        cand = _scored(val[(i, steps)], data["val"].y, value=value, params=params)
        if dynamics is not None:
            stats = kernel_behaviour(
                model0,
                _tuned(model0, params),
                x,
                getattr(data["test"], x_key),
                data["test"].y,
                **dynamics,
            )
            cand["test"] = stats["f_ft"]
            cand["stats"] = stats
        cands.append(cand)
    wide_cands = [
        _scored(val[(i, t)], data["val"].y, scale=scale, steps=t, params=p)
        for i, t, p in flat
        if i >= len(grid)
        for scale in (wide[i - len(grid)][0],)
    ]
    return cands, wide_cands, sum(diverged[len(grid) :])


def _test_outputs(model0, cand, x_test):
    """The test outputs of a candidate of :func:`_fine_tune_grid`, read once."""
    if "test" not in cand:
        cand["test"] = outputs(_tuned(model0, cand["params"]), x_test)
    return cand["test"]


def _wide_grid(model0, data, x_key, lazy, wide, config, dynamics) -> dict:
    """The validated choice among the grid's SGD runs ``lazy`` and the wide runs'
    candidates ``wide`` (both from :func:`_fine_tune_grid`: runs at each of
    ``config.wide_scales`` read at each of ``config.wide_checkpoints``), with its
    kernel behaviour (``"stats"``, from ``dynamics`` at theta_0: the run that
    validation selects is the one the paper's Table 7 measures)."""
    cands = [
        {**c, "scale": c["value"], "steps": config.steps}
        for c in lazy
        if not c.get("diverged")
    ]
    best = _select(cands + list(wide))
    if "stats" not in best:
        best["stats"] = kernel_behaviour(
            model0,
            _tuned(model0, best["params"]),
            getattr(data["train"], x_key),
            getattr(data["test"], x_key),
            data["test"].y,
            **dynamics,
        )
        best["test"] = best["stats"]["f_ft"]
    return best


def _trimmed(task, pad_id: int):
    """``task`` without the columns that are padding in every row (the padding is at
    the end of each row): the models mask padding out of attention and read one
    position, so their outputs are those of the padded inputs, in fewer operations."""

    def cut(x):
        return x[:, : int((x != pad_id).any(0).nonzero().max()) + 1]

    return dataclasses.replace(
        task, x_prompt=cut(task.x_prompt), x_plain=cut(task.x_plain)
    )


def _one_run(mlm, lang, k, seed, config, test, prompt_test, z_test, bow_test):
    """Every method of the chapter on one k-shot training set; see
    :class:`KernelExperiment`."""
    from ..adapt.lora import apply_lora
    from ..theory.kernels import jacobian

    data = {
        "train": _trimmed(few_shot_task(lang, k, seed), lang.pad_id),
        "val": _trimmed(few_shot_task(lang, k, seed, split="validation"), lang.pad_id),
        "test": test,
    }
    y = {split: d.y for split, d in data.items()}
    acc, chosen, dyn, by_lr, example, diverged = {}, {}, {}, {}, {}, {}
    seed_everything(seed)

    def count_diverged(setting, method, cands):
        diverged[(setting, method)] = sum(bool(c.get("diverged")) for c in cands)

    def analog(model0, x_key, cands, value):
        """Test accuracy of the grid candidate at ``value`` (it must not diverge)."""
        (cand,) = [c for c in cands if c["value"] == value]
        if cand.get("diverged"):
            raise FineTuneDiverged("the analog run", float(value), -1, "its output")
        return sign_accuracy(_test_outputs(model0, cand, getattr(test, x_key)), test.y)

    def sgd_runs(model0, x_key, j_train, *, dynamics=None, wide=True):
        """The SGD grid (scales c, rate c / K̄) and, with ``wide``, the wide runs."""
        mean_diag = _mean_diag(j_train)
        grid = [(c, c / mean_diag) for c in config.sgd_lr_scales]
        runs = [
            (c, c / mean_diag, config.wide_checkpoints)
            for c in (config.wide_scales if wide else ())
        ]
        return _fine_tune_grid(
            model0, data, x_key, "sgd", grid, config.steps, dynamics=dynamics, wide=runs
        )

    def record_sgd(setting, cands):
        count_diverged(setting, "SGD-FT", cands)
        best = _select(cands)
        acc[(setting, "SGD-FT")] = sign_accuracy(best["test"], test.y)
        chosen[(setting, "SGD-FT")] = best["value"]
        dyn[(setting, "SGD")] = {m: best["stats"][m] for m in _DYNAMICS}
        by_lr[setting] = {
            m: [c["stats"][m] for c in cands] for m in ("lin_error", "kernel_change")
        }
        example[setting] = {
            "f0": cands[0]["stats"]["f0"],
            "f_ft": torch.stack([c["stats"]["f_ft"] for c in cands]),
            "f_lin": torch.stack([c["stats"]["f_lin"] for c in cands]),
        }

    def record_wide(setting, model0, x_key, lazy, wide, n, dynamics):
        if not config.wide_scales:
            return
        best = _wide_grid(model0, data, x_key, lazy, wide, config, dynamics)
        dyn[(setting, "SGD, wide grid")] = {m: best["stats"][m] for m in _DYNAMICS}
        diverged[(setting, "SGD-FT, wide grid")] = n
        acc[(setting, "SGD-FT, wide grid")] = sign_accuracy(best["test"], test.y)
        chosen[(setting, "SGD-FT, wide grid")] = best["scale"]
        chosen[(setting, "SGD-FT, wide grid, steps")] = best["steps"]

    # -- prompt-based
    # -------------------------------------------------------------------
    prompt0, j_te, f0_te = prompt_test
    j = {"test": j_te}
    f0 = {"test": f0_te}
    for split in ("train", "val"):
        j[split] = jacobian(prompt0, data[split].x_prompt)
        f0[split] = outputs(prompt0, data[split].x_prompt)
    acc[("prompt", "zero-shot")] = sign_accuracy(f0_te, test.y)
    dyn[("prompt", "start")] = start_measures(prompt0, j["train"], f0["train"], y)
    everything = config.methods == "all"
    names = ("sgd", "asymmetric_signgd", "signgd") if everything else ("sgd",)
    fits, every_fit = _kernel_fits(j, f0, y, config.kernel_regs, names)
    for name, method in (
        ("sgd", "K-SGD"),
        ("asymmetric_signgd", "K-A-SignGD"),
        ("signgd", "K-SignGD"),
    ):
        if name in fits:
            acc[("prompt", method)], chosen[("prompt", method)] = fits[name]
    dynamics = {"j_te": j_te, "j_tr0": j["train"], "f0_te": f0_te}
    cands, wide, n = sgd_runs(prompt0, "x_prompt", j["train"], dynamics=dynamics)
    record_sgd("prompt", cands)
    record_wide("prompt", prompt0, "x_prompt", cands, wide, n, dynamics)
    fixed = config.analog_lr_scale
    if fixed is not None:  # the run at c and its own kernel analogs, no validation
        acc[("prompt", "SGD-FT, fixed c")] = analog(prompt0, "x_prompt", cands, fixed)
        acc[("prompt", "K-SGD, analog ridge")] = every_fit["sgd"][
            config.analog_reg("sgd")
        ]
        acc[("prompt", "K-SGD, same steps")] = sign_accuracy(
            same_steps_outputs(j, f0, y, fixed, config.steps).float(), y["test"]
        )
    if everything:
        adam = [(lr, lr) for lr in config.adam_lrs]
        cands, _, _ = _fine_tune_grid(
            prompt0, data, "x_prompt", "adam", adam, config.steps
        )
        count_diverged("prompt", "Adam-FT", cands)
        if fixed is not None:
            acc[("prompt", "Adam-FT, fixed lr")] = analog(
                prompt0, "x_prompt", cands, config.analog_adam_lr
            )
            acc[("prompt", "K-A-SignGD, analog ridge")] = every_fit[
                "asymmetric_signgd"
            ][config.analog_reg("asymmetric_signgd")]
        if config.signgd_batch1_scale is not None:
            steps = config.signgd_batch1_passes * len(y["train"])
            lr = config.signgd_batch1_scale / float(j["train"].abs().sum(1).mean())
            tuned = fine_tune_logistic(
                prompt0,
                data["train"].x_prompt,
                y["train"],
                LogisticFineTuneConfig("signgd", lr, steps, batch_size=1),
                seed=seed,
            )
            acc[("prompt", "SignGD-FT, batch 1")] = sign_accuracy(
                outputs(tuned, test.x_prompt), test.y
            )
            acc[("prompt", "K-A-SignGD, same steps")] = sign_accuracy(
                signgd_same_steps_outputs(j, f0, y, lr, steps, seed).float(), test.y
            )
        best = _select(cands)
        acc[("prompt", "Adam-FT")] = sign_accuracy(
            _test_outputs(prompt0, best, test.x_prompt), test.y
        )
        chosen[("prompt", "Adam-FT")] = best["value"]
        stats = kernel_behaviour(  # the kernel behaviour of the chosen Adam run
            prompt0,
            _tuned(prompt0, best["params"]),
            data["train"].x_prompt,
            test.x_prompt,
            test.y,
            **dynamics,
        )
        dyn[("prompt", "Adam")] = {m: stats[m] for m in _DYNAMICS}
        lora = apply_lora(prompt0, config.lora_rank, seed=seed)
        j_lora = jacobian(lora, data["train"].x_prompt)
        cands, _, _ = sgd_runs(lora, "x_prompt", j_lora, wide=False)
        count_diverged("prompt", "LoRA-SGD-FT", cands)
        best = _select(cands)
        acc[("prompt", "LoRA-SGD-FT")] = sign_accuracy(
            _test_outputs(lora, best, test.x_prompt), test.y
        )
        chosen[("prompt", "LoRA-SGD-FT")] = best["value"]

    # -- standard: linear probe on [CLS], then fine-tune from it ----------------------
    z = {"test": z_test}
    for split in ("train", "val"):
        z[split] = outputs(mlm.hidden, data[split].x_plain)[:, 0]
    probe = logistic_probe_head(
        z["train"], y["train"], z["val"], y["val"], config.probe_regs
    )
    acc[("standard", "LP")] = sign_accuracy(
        (z_test.double() @ probe["w"] + probe["b"]).float(), test.y
    )
    chosen[("standard", "LP")] = probe["reg"]
    if config.standard_head == "random":
        std0 = CLSClassifier(mlm, seed=seed)
    elif config.standard_head == "probe":
        std0 = CLSClassifier(mlm, head=(probe["w"], probe["b"]))
    else:  # the paper's head: cross-validated on the training examples only
        cv = cross_validated_probe_head(z["train"], y["train"])
        std0 = CLSClassifier(mlm, head=(cv["w"], cv["b"]))
        acc[("standard", "CV probe")] = sign_accuracy(
            (z_test.double() @ cv["w"] + cv["b"]).float(), test.y
        )
        chosen[("standard", "CV probe")] = cv["C"]
    j, f0 = {}, {}
    for split in ("train", "val", "test"):
        j[split] = jacobian(std0, data[split].x_plain)
        f0[split] = outputs(std0, data[split].x_plain)
    dyn[("standard", "start")] = start_measures(std0, j["train"], f0["train"], y)
    fits, _ = _kernel_fits(j, f0, y, config.kernel_regs, ("sgd",))
    acc[("standard", "K-SGD")], chosen[("standard", "K-SGD")] = fits["sgd"]
    dynamics = {"j_te": j["test"], "j_tr0": j["train"], "f0_te": f0["test"]}
    cands, wide, n = sgd_runs(std0, "x_plain", j["train"], dynamics=dynamics)
    record_sgd("standard", cands)
    record_wide("standard", std0, "x_plain", cands, wide, n, dynamics)
    if fixed is not None:
        acc[("standard", "SGD-FT, fixed c")] = analog(std0, "x_plain", cands, fixed)
        acc[("standard", "K-SGD, same steps")] = sign_accuracy(
            same_steps_outputs(j, f0, y, fixed, config.steps).float(), y["test"]
        )
    del j

    # -- a bag of words
    # -----------------------------------------------------------------
    bow = {split: lang.bag_of_words(data[split].words) for split in ("train", "val")}
    fit = logistic_probe_head(
        bow["train"], y["train"], bow["val"], y["val"], config.probe_regs
    )
    acc[("bag of words", "LR")] = sign_accuracy(
        (bow_test.double() @ fit["w"] + fit["b"]).float(), test.y
    )
    chosen[("bag of words", "LR")] = fit["reg"]
    return acc, chosen, dyn, by_lr, example, diverged


def _key(*parts) -> str:
    return "|".join(str(p) for p in parts)


def _experiment_entry(pretrain, config) -> dict:
    """The runs of :func:`run_kernel_experiment` computed afresh, as the plain data
    that the model cache (or the stored file, :mod:`.ch4_stored`) keeps."""
    from ..theory.kernels import jacobian

    mlm, _ = pretrain_masked_lm(pretrain)
    lang = SentimentLanguage(pretrain.language)
    test = _trimmed(test_set(lang, config.n_test), lang.pad_id)
    prompt0 = PromptClassifier(mlm, lang)
    prompt_test = (
        prompt0,
        jacobian(prompt0, test.x_prompt),
        outputs(prompt0, test.x_prompt),
    )
    z_test = outputs(mlm.hidden, test.x_plain)[:, 0]
    bow_test = lang.bag_of_words(test.words)
    entry = {
        "accuracy": {},
        "chosen": {},
        "dynamics": {},
        "by_lr": {},
        "diverged": {},
    }
    runs = [(k, seed) for k in config.shots for seed in config.seeds]
    for k, seed in progress(runs, total=len(runs), desc="few-shot runs"):
        acc, chosen, dyn, by_lr, example, diverged = _one_run(
            mlm, lang, k, seed, config, test, prompt_test, z_test, bow_test
        )
        for (setting, method), n in diverged.items():
            key = _key(setting, method, k)
            entry["diverged"][key] = entry["diverged"].get(key, 0) + n
        for (setting, method), v in acc.items():
            entry["accuracy"].setdefault(_key(setting, method, k), []).append(v)
        for (setting, method), v in chosen.items():
            entry["chosen"].setdefault(_key(setting, method, k), []).append(float(v))
        for (setting, opt), stats in dyn.items():
            d = entry["dynamics"].setdefault(_key(setting, opt, k), {})
            for m, v in stats.items():
                d.setdefault(m, []).append(float(v))
        for setting, stats in by_lr.items():
            d = entry["by_lr"].setdefault(_key(setting, k), {})
            for m, v in stats.items():
                d.setdefault(m, []).append([float(u) for u in v])
        if seed == config.seeds[0] and k == max(config.shots):
            entry["example"] = example
    return entry


def run_kernel_experiment(
    pretrain: MLMPretrainConfig = MLMPretrainConfig(),
    config: KernelExperimentConfig = KernelExperimentConfig(),
) -> KernelExperiment:
    """Fine-tune the masked LM pretrained with ``pretrain`` few-shot and fit the kernel
    analogs, for every ``k`` in ``config.shots`` and seed in ``config.seeds``; see
    :class:`KernelExperiment`. The results are computed once per (``pretrain``,
    ``config``, seed offset) and then read from the on-disk cache; page 04's costliest
    runs at seed offset 0 are read from the book's stored file instead
    (:mod:`fmlab.chapters.ch4_stored`)."""
    from .ch4_stored import stored_entry

    if not isinstance(pretrain, MLMPretrainConfig):
        raise TypeError(
            f"pretrain must be a MLMPretrainConfig, got {type(pretrain).__name__}"
        )
    if not isinstance(config, KernelExperimentConfig):
        raise TypeError(
            f"config must be a KernelExperimentConfig, got {type(config).__name__}"
        )
    entry = stored_entry(pretrain, config)  # page 04's k = 16 runs at seed offset 0
    if entry is None:
        entry = cached(
            {"pretrain": pretrain, "experiment": config},
            lambda: _experiment_entry(pretrain, config),
            name="ch4_fewshot",
        )

    def split(key):
        parts = key.split("|")
        return (*parts[:-1], int(parts[-1]))

    return KernelExperiment(
        config=config,
        accuracy={split(k): v for k, v in entry["accuracy"].items()},
        chosen={split(k): v for k, v in entry["chosen"].items()},
        dynamics={split(k): v for k, v in entry["dynamics"].items()},
        by_lr={split(k): v for k, v in entry["by_lr"].items()},
        example=entry["example"],
        diverged={split(k): v for k, v in entry["diverged"].items()},
    )


def lazy_grid(steps: int) -> dict:
    """The grids of lazy fine-tuning for ``steps`` full-batch steps: SGD scales
    :math:`c \\in \\{1/2, 1, 2\\}` and the ridges :math:`1/(cT)` that match
    :math:`c \\in \\{1/2, 1, 2, 4, 8\\}` (keyword arguments of
    :class:`KernelExperimentConfig`)."""
    steps = check_int("steps", steps, minimum=1)
    regs = tuple(1 / (c * steps) for c in (0.5, 1, 2, 4, 8))
    return dict(steps=steps, sgd_lr_scales=(0.5, 1.0, 2.0), kernel_regs=regs)


def wide_grid(
    steps: int,
    scales: tuple[float, ...] = (4.0, 16.0, 64.0),
    checkpoints: tuple[int, ...] = (30, 100),
) -> dict:
    """:func:`lazy_grid` widened for the validated comparison of the paper: SGD-FT
    also runs at the larger ``scales``, read at each of ``checkpoints`` (step counts),
    and the kernel's ridges are :math:`1/(ct)` for every fine-tuning candidate's scale
    and step count, so that both sides search matching ranges (keyword arguments of
    :class:`KernelExperimentConfig`)."""
    grid = lazy_grid(steps)
    for t in checkpoints:
        check_int("checkpoints", t, minimum=1)
    for c in scales:
        check_float("scales", c, minimum=0.0, strict_min=True)
    wide = {1 / (c * t) for c in scales for t in checkpoints}
    regs = sorted(set(grid["kernel_regs"]) | wide, reverse=True)
    return dict(
        grid,
        kernel_regs=tuple(regs),
        wide_scales=tuple(float(c) for c in scales),
        wide_checkpoints=tuple(int(t) for t in checkpoints),
    )


@dataclass
class FewShotRuns:
    """The experiments of :func:`few_shot_runs`, one per number of shots, merged.

    ``accuracy[(setting, method, k)]``: test accuracies per run (an array);
    ``dynamics[(setting, optimizer, k)][measure]``: the kernel-behaviour measures of
    the chosen runs (arrays); ``by_lr[(setting, k)]``, ``chosen`` and ``examples[k]``
    as in :class:`KernelExperiment`; ``diverged``: the fine-tuning candidates that
    diverged (dropped), all runs together.
    """

    configs: tuple
    accuracy: dict
    dynamics: dict
    by_lr: dict
    chosen: dict
    examples: dict
    lr_scales: dict  # k -> the SGD learning-rate scales of its grid
    diverged: int

    @property
    def shots(self) -> tuple[int, ...]:
        return tuple(k for c in self.configs for k in c.shots)

    def points(self, a: tuple[str, str], b: tuple[str, str], k: int) -> np.ndarray:
        """Per-run difference of two (setting, method) test accuracies at ``k``, in
        points (paired by run)."""
        return 100 * (self.accuracy[(*a, k)] - self.accuracy[(*b, k)])

    def log_ratio(self, measure: str, k: int) -> np.ndarray:
        """log(standard / prompt) of a laziness measure in the SGD runs validation
        chose, per run."""
        return np.log(
            self.dynamics[("standard", "SGD", k)][measure]
            / self.dynamics[("prompt", "SGD", k)][measure]
        )

    def at_scale(
        self, setting: str, measure: str, k: int, c: float = 1.0
    ) -> np.ndarray:
        """A laziness measure (``lin_error`` or ``kernel_change``) of the SGD run at
        learning-rate scale ``c`` of the lazy grid, per run: the two settings compared
        at a matched scale, with no validation choice."""
        i = self.lr_scales[k].index(c)
        return np.asarray(self.by_lr[(setting, k)][measure], dtype=float)[:, i]

    def matched_log_ratio(self, measure: str, k: int, c: float = 1.0) -> np.ndarray:
        """log(standard / prompt) of a laziness measure at the same learning-rate
        scale ``c``, per run."""
        return np.log(
            self.at_scale("standard", measure, k, c)
            / self.at_scale("prompt", measure, k, c)
        )

    def kernel_change_growth(self) -> np.ndarray:
        """log(kernel change at the largest c / at the smallest), prompt-based SGD,
        one value per run, every k in turn."""
        return np.concatenate(
            [
                np.log(
                    np.asarray(self.by_lr[("prompt", k)]["kernel_change"], dtype=float)
                )[:, -1]
                - np.log(
                    np.asarray(self.by_lr[("prompt", k)]["kernel_change"], dtype=float)
                )[:, 0]
                for k in self.shots
            ]
        )


def few_shot_runs(
    pretrain: MLMPretrainConfig, configs: tuple[KernelExperimentConfig, ...]
) -> FewShotRuns:
    """:func:`run_kernel_experiment` for each config (cached), merged; see
    :class:`FewShotRuns`."""
    if not configs:
        raise ValueError("configs must hold at least one KernelExperimentConfig")
    res = {c.shots: run_kernel_experiment(pretrain, c) for c in configs}
    return FewShotRuns(
        configs=tuple(configs),
        accuracy={
            key: np.array(v) for r in res.values() for key, v in r.accuracy.items()
        },
        dynamics={
            key: {m: np.array(v) for m, v in d.items()}
            for r in res.values()
            for key, d in r.dynamics.items()
        },
        by_lr={key: v for r in res.values() for key, v in r.by_lr.items()},
        chosen={key: v for r in res.values() for key, v in r.chosen.items()},
        examples={k: r.example for r in res.values() for k in r.config.shots},
        lr_scales={
            k: r.config.sgd_lr_scales for r in res.values() for k in r.config.shots
        },
        diverged=sum(n for r in res.values() for n in r.diverged.values()),
    )
