"""Linear probing, fine-tuning and LP-FT for classification, and how far features move.

The methods compared in Chapter 3 (``notebooks/03-lp-vs-ft.ipynb``), after
:cite:t:`kumar2022finetuning`. A pretrained encoder :math:`\\phi_\\theta` and a linear head
:math:`(W, b)` give logits :math:`W\\phi_\\theta(x) + b`; the adaptation loss is the
cross-entropy on the :math:`n` labelled ID examples.

* **LP** freezes :math:`\\theta` and solves the convex problem
  :math:`\\min_{W,b} \\frac1n\\sum_i \\mathrm{CE}(W\\phi(x_i)+b, y_i) + \\lambda\\lVert W\\rVert_F^2`
  to numerical precision by Newton's method (:func:`softmax_regression`).
* **FT** trains :math:`\\theta` and a randomly initialised head together (full-batch SGD with
  momentum, :func:`fine_tune_classifier`).
* **LP-FT** runs the same fine-tuning from the LP head.
* **Scratch** trains the same architecture from a random initialisation.

The *feature change* of an input is :math:`\\lVert\\phi_{\\text{after}}(x) - \\phi_{\\text{before}}(x)\\rVert_2`;
:func:`feature_change` averages it over a set of inputs. :func:`run_lpft_experiment` runs all
four methods, each with a small hyper-parameter search on ID validation data only.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import check_float, check_int, check_same_length, check_tensor
from .data.shift import StyleShiftConfig, StyleShiftWorld
from .models.mlp import MLP
from .repro import make_generator, seed_everything
from .train import cached, progress, train

__all__ = [
    "softmax_regression",
    "linear_head",
    "random_head",
    "accuracy",
    "feature_change",
    "layer_feature_change",
    "FineTuneResult",
    "fine_tune_classifier",
    "LPFTConfig",
    "build_encoder",
    "pretrain_encoder",
    "run_lpft_experiment",
    "feature_change_at_loss",
]


# -- linear probing -------------------------------------------------------------------
def _softmax_objective(theta, Ft, y, l2, k):
    return F.cross_entropy(Ft @ theta.T, y) + l2 * theta[:, :k].pow(2).sum()


def softmax_regression(
    features: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    *,
    l2: float,
    max_iter: int = 100,
    tol: float = 1e-9,
) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-regularised multinomial logistic regression, solved by Newton's method.

    Minimises :math:`\\frac1n\\sum_i \\mathrm{CE}(W f_i + b, y_i) + \\lambda\\lVert W\\rVert_F^2` (the
    bias is not penalised). With :math:`P` the softmax probabilities and :math:`\\tilde f = (f, 1)`,
    the gradient is :math:`\\frac1n (P - Y)^\\top \\tilde F` plus :math:`2\\lambda W`, and the Hessian
    block of classes :math:`(a, b)` is
    :math:`\\frac1n\\sum_i (P_{ia}\\delta_{ab} - P_{ia}P_{ib})\\,\\tilde f_i\\tilde f_i^\\top` plus
    :math:`2\\lambda I` on the weights. Newton steps with a backtracking line search stop when
    the gradient's norm is below ``tol``.

    Returns ``(W, b)`` of shapes ``(n_classes, k)`` and ``(n_classes,)``, float64.
    """
    features = check_tensor("features", features, ndim=2, floating=True)
    labels = check_tensor("labels", labels, ndim=1, integer=True)
    n = check_same_length(("features", "labels"), features, labels)
    C = check_int("n_classes", n_classes, minimum=2)
    l2 = check_float("l2", l2, minimum=0.0)
    max_iter = check_int("max_iter", max_iter, minimum=1)
    tol = check_float("tol", tol, minimum=0.0, strict_min=True)
    if n == 0:
        raise ValueError("features must have at least one row")
    if int(labels.min()) < 0 or int(labels.max()) >= C:
        raise ValueError(
            f"labels must lie in [0, {C - 1}], got range [{int(labels.min())}, {int(labels.max())}]"
        )
    k = features.shape[1]
    Ft = torch.cat([features.double(), torch.ones(n, 1, dtype=torch.float64)], dim=1)
    Y = F.one_hot(labels, C).double()
    reg = torch.zeros(C, k + 1, dtype=torch.float64)
    reg[:, :k] = 2 * l2
    theta = torch.zeros(C, k + 1, dtype=torch.float64)
    size = C * (k + 1)
    for _ in range(max_iter):
        P = torch.softmax(Ft @ theta.T, dim=1)
        grad = (P - Y).T @ Ft / n + reg * theta
        if float(grad.norm()) < tol:
            break
        A = (P.unsqueeze(2) * Ft.unsqueeze(1)).reshape(n, size)  # (n, C(k+1))
        H = -(A.T @ A) / n
        blocks = torch.einsum("sa,si,sj->aij", P, Ft, Ft) / n
        for a in range(C):
            sl = slice(a * (k + 1), (a + 1) * (k + 1))
            H[sl, sl] += blocks[a]
        H += torch.diag(reg.flatten())
        # the bias shift (same constant to every class) leaves the loss unchanged: a tiny ridge fixes the null direction
        H += (
            1e-10
            * max(1.0, float(H.diagonal().max()))
            * torch.eye(size, dtype=torch.float64)
        )
        step = torch.linalg.solve(H, grad.flatten()).reshape(C, k + 1)
        f0 = float(_softmax_objective(theta, Ft, labels, l2, k))
        slope = float((grad * step).sum())
        t = 1.0
        while t > 1e-12:
            cand = theta - t * step
            if (
                float(_softmax_objective(cand, Ft, labels, l2, k))
                <= f0 - 1e-4 * t * slope
            ):
                break
            t *= 0.5
        theta = cand
    return theta[:, :k].contiguous(), theta[:, k].contiguous()


def linear_head(W: torch.Tensor, b: torch.Tensor) -> nn.Linear:
    """An ``nn.Linear`` holding the head ``(W, b)`` (float32)."""
    W = check_tensor("W", W, ndim=2, floating=True)
    b = check_tensor("b", b, shape=(W.shape[0],), floating=True)
    head = nn.Linear(W.shape[1], W.shape[0])
    with torch.no_grad():
        head.weight.copy_(W.float())
        head.bias.copy_(b.float())
    return head


def random_head(rep_dim: int, n_classes: int, generator: torch.Generator) -> nn.Linear:
    """A freshly initialised head, as in ordinary fine-tuning: entries uniform in
    :math:`\\pm 1/\\sqrt{k}` (PyTorch's default for ``nn.Linear``), drawn from ``generator``."""
    k = check_int("rep_dim", rep_dim, minimum=1)
    C = check_int("n_classes", n_classes, minimum=2)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}"
        )
    bound = k**-0.5
    W = (torch.rand(C, k, generator=generator) * 2 - 1) * bound
    b = (torch.rand(C, generator=generator) * 2 - 1) * bound
    return linear_head(W, b)


# -- measurements ---------------------------------------------------------------------
@torch.no_grad()
def accuracy(
    encoder: nn.Module, head: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> float:
    """Fraction of ``x`` whose predicted class ``argmax head(encoder(x))`` equals ``y``."""
    x = check_tensor("x", x, ndim=2, floating=True)
    y = check_tensor("y", y, ndim=1, integer=True)
    check_same_length(("x", "y"), x, y)
    return float((head(encoder(x)).argmax(1) == y).double().mean())


@torch.no_grad()
def feature_change(before: nn.Module, after: nn.Module, x: torch.Tensor) -> float:
    """The average :math:`\\ell_2` feature change :math:`\\frac1n\\sum_i\\lVert\\phi_{\\text{after}}(x_i) - \\phi_{\\text{before}}(x_i)\\rVert_2`."""
    x = check_tensor("x", x, ndim=2, floating=True)
    if len(x) == 0:
        raise ValueError("x must have at least one row")
    return float((after(x) - before(x)).norm(dim=1).mean())


@torch.no_grad()
def layer_feature_change(before: MLP, after: MLP, x: torch.Tensor) -> torch.Tensor:
    """Relative change of every hidden layer's output (after each ReLU) of an :class:`MLP` encoder.

    Entry :math:`l` is :math:`\\mathrm{mean}_i\\lVert h^{\\text{after}}_l(x_i) - h^{\\text{before}}_l(x_i)\\rVert
    / \\mathrm{mean}_i\\lVert h^{\\text{before}}_l(x_i)\\rVert`; the last entry is the representation.
    """
    if not (isinstance(before, MLP) and isinstance(after, MLP)):
        raise TypeError("before and after must be fmlab MLP encoders")
    x = check_tensor("x", x, ndim=2, floating=True)
    out = []
    a, b = x, x
    for m0, m1 in zip(before.net, after.net):
        a, b = m0(a), m1(b)
        if isinstance(m0, nn.ReLU):
            out.append(
                float(
                    (b - a).norm(dim=1).mean() / a.norm(dim=1).mean().clamp_min(1e-12)
                )
            )
    return torch.tensor(out, dtype=torch.float64)


# -- fine-tuning ----------------------------------------------------------------------
@dataclass
class FineTuneResult:
    """What :func:`fine_tune_classifier` returns.

    ``trace`` holds, at the recorded steps, the training loss and the feature change of
    every tracked set of inputs (name -> tensor).
    """

    encoder: nn.Module
    head: nn.Linear
    train_loss: torch.Tensor
    trace_steps: torch.Tensor
    trace: dict = field(default_factory=dict)


def fine_tune_classifier(
    encoder: nn.Module,
    head: nn.Linear,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    steps: int,
    momentum: float = 0.9,
    track: dict | None = None,
    track_every: int = 10,
) -> FineTuneResult:
    """Train copies of ``encoder`` and ``head`` on the cross-entropy of ``(x, y)``.

    Full-batch SGD with momentum over every parameter, for ``steps`` steps. FT passes a
    :func:`random_head`, LP-FT the LP head. ``track`` maps names to input tensors whose
    average feature change (from the starting encoder) is recorded every ``track_every``
    steps, together with the training loss.
    """
    if not isinstance(encoder, nn.Module):
        raise TypeError(
            f"encoder must be a torch.nn.Module, got {type(encoder).__name__}"
        )
    if not isinstance(head, nn.Linear):
        raise TypeError(f"head must be a torch.nn.Linear, got {type(head).__name__}")
    x = check_tensor("x", x, ndim=2, floating=True)
    y = check_tensor("y", y, ndim=1, integer=True)
    check_same_length(("x", "y"), x, y)
    lr = check_float("lr", lr, minimum=0.0, strict_min=True)
    steps = check_int("steps", steps, minimum=0)
    momentum = check_float("momentum", momentum, minimum=0.0, maximum=1.0)
    track_every = check_int("track_every", track_every, minimum=1)
    track = dict(track or {})
    for name, xs in track.items():
        check_tensor(f"track[{name!r}]", xs, ndim=2, floating=True)
    enc, hd = copy.deepcopy(encoder), copy.deepcopy(head)
    enc.train()
    with torch.no_grad():
        base = {name: encoder(xs) for name, xs in track.items()}
    opt = torch.optim.SGD(
        list(enc.parameters()) + list(hd.parameters()), lr=lr, momentum=momentum
    )
    losses = torch.empty(steps + 1)
    rec_steps, rec = [], {"train_loss": [], **{name: [] for name in track}}
    for step in range(steps + 1):
        loss = F.cross_entropy(hd(enc(x)), y)
        losses[step] = loss.detach()
        if track and (step % track_every == 0 or step == steps):
            rec_steps.append(step)
            rec["train_loss"].append(float(loss.detach()))
            with torch.no_grad():
                for name, xs in track.items():
                    rec[name].append(float((enc(xs) - base[name]).norm(dim=1).mean()))
        if step == steps:
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    enc.eval()
    trace = (
        {k: torch.tensor(v, dtype=torch.float64) for k, v in rec.items()}
        if track
        else {}
    )
    return FineTuneResult(
        enc, hd, losses, torch.tensor(rec_steps, dtype=torch.long), trace
    )


# -- the experiment -------------------------------------------------------------------
@dataclass(frozen=True)
class LPFTConfig:
    """Everything that determines Chapter 3's nonlinear experiment.

    Each seed draws its own world (``world`` with ``seed`` replaced), pretrains its own
    encoder on the source distribution, and draws its own ID and OOD data.
    """

    world: StyleShiftConfig = field(default_factory=StyleShiftConfig)
    width: int = 128
    depth: int = 2
    rep_dim: int = 32
    first_layer_bias: bool = False
    pretrain_steps: int = 500
    pretrain_batch: int = 256
    pretrain_lr: float = 3e-3
    n_train: int = 256
    n_val: int = 1000
    n_test: int = 2000
    ft_steps: int = 200
    momentum: float = 0.9
    lrs: tuple = (1e-3, 3e-3, 1e-2)
    scratch_lrs: tuple = (3e-2, 1e-1)
    l2s: tuple = (1e-4, 1e-3, 1e-2)
    seeds: tuple = (0, 1, 2, 3, 4)
    n_track: int = 500
    track_every: int = 10

    def __post_init__(self):
        if not isinstance(self.world, StyleShiftConfig):
            raise TypeError(
                f"world must be a StyleShiftConfig, got {type(self.world).__name__}"
            )
        for name in (
            "width",
            "depth",
            "rep_dim",
            "pretrain_steps",
            "pretrain_batch",
            "n_train",
            "n_val",
            "n_test",
            "ft_steps",
            "n_track",
            "track_every",
        ):
            check_int(name, getattr(self, name), minimum=1)
        check_float("pretrain_lr", self.pretrain_lr, minimum=0.0, strict_min=True)
        check_float("momentum", self.momentum, minimum=0.0, maximum=1.0)
        for name in ("lrs", "scratch_lrs", "l2s", "seeds"):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty tuple")
        for v in self.lrs + self.scratch_lrs:
            check_float("lrs", v, minimum=0.0, strict_min=True)
        for v in self.l2s:
            check_float("l2s", v, minimum=0.0)
        for s in self.seeds:
            check_int("seeds", s, minimum=0)
        if self.n_track > self.n_test:
            raise ValueError(
                f"n_track must be <= n_test, got {self.n_track} > {self.n_test}"
            )


def build_encoder(cfg: LPFTConfig) -> MLP:
    """The encoder :math:`\\phi_\\theta`: an MLP ``D -> width (x depth) -> rep_dim`` with ReLUs.

    Without ``first_layer_bias`` the first layer is linear, as in the theory: its response
    to an input direction that no training input has is then frozen by fine-tuning.
    """
    enc = MLP(
        [cfg.world.dim_input] + [cfg.width] * cfg.depth + [cfg.rep_dim],
        final_activation=True,
    )
    if not cfg.first_layer_bias:
        enc.net[0] = nn.Linear(cfg.world.dim_input, cfg.width, bias=False)
    return enc


@dataclass(frozen=True)
class _PretrainKey:
    world: StyleShiftConfig
    width: int
    depth: int
    rep_dim: int
    first_layer_bias: bool
    steps: int
    batch: int
    lr: float


def pretrain_encoder(cfg: LPFTConfig, seed: int) -> tuple[MLP, torch.Tensor]:
    """Pretrain (or load from the cache) the encoder of world ``seed`` on the source distribution.

    The pretraining task is to classify the object type from inputs of every style, with a
    linear head on :math:`\\phi_\\theta` and Adam on fresh mini-batches. Returns the encoder
    (in eval mode) and the mini-batch pretraining losses.
    """
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    seed = check_int("seed", seed, minimum=0)
    wcfg = dataclasses.replace(cfg.world, seed=seed)
    key = _PretrainKey(
        wcfg,
        cfg.width,
        cfg.depth,
        cfg.rep_dim,
        cfg.first_layer_bias,
        cfg.pretrain_steps,
        cfg.pretrain_batch,
        cfg.pretrain_lr,
    )

    def build():
        seed_everything(seed)
        world = StyleShiftWorld(wcfg)
        model = nn.Sequential(build_encoder(cfg), nn.Linear(cfg.rep_dim, wcfg.n_types))
        g = make_generator(seed + 1)

        def batch(_step):
            s = world.source(cfg.pretrain_batch, g)
            return s.x, s.types

        def loss_fn(m, b):
            return F.cross_entropy(m(b[0]), b[1])

        res = train(
            model,
            loss_fn,
            batch,
            steps=cfg.pretrain_steps,
            lr=cfg.pretrain_lr,
            desc=f"pretraining (world {seed})",
        )
        state = {k[2:]: v for k, v in model.state_dict().items() if k.startswith("0.")}
        return {"encoder": state, "losses": res.losses}

    out = cached(key, build, name="ch03_encoder")
    enc = build_encoder(cfg)
    enc.load_state_dict(out["encoder"])
    enc.eval()
    return enc, out["losses"]


def feature_change_at_loss(trace: torch.Tensor, target: float) -> float:
    """The ID feature change of a run when its training loss first falls to ``target``.

    ``trace`` is one run's ``(R, 3)`` record (training loss, ID change, OOD change) from
    :func:`run_lpft_experiment`; if the loss never reaches ``target`` the last record is used.
    Comparing two methods at the same training loss is the comparison of the source talk.
    """
    trace = check_tensor("trace", trace, shape=(None, 3), floating=True)
    target = check_float("target", target)
    below = (trace[:, 0] <= target).nonzero()
    i = int(below[0]) if len(below) else trace.shape[0] - 1
    return float(trace[i, 1])


def _select(candidates):
    """The candidate with the best ID validation accuracy (the first one on ties)."""
    return max(range(len(candidates)), key=lambda i: (candidates[i]["val"], -i))


def run_lpft_experiment(cfg: LPFTConfig) -> dict:
    """Scratch, LP, FT and LP-FT on every seed's world; cached on disk by ``cfg``.

    Returns a dict of float64 tensors (``S`` seeds):

    * ``acc[method]``: ``(S, 2)`` ID and OOD test accuracy of the hyper-parameter chosen on
      ID validation data; ``chosen[method]``: the chosen learning rate (or ``l2`` for LP);
    * ``sweep[method]``: ``(S, len(grid), 3)`` validation, ID and OOD accuracy at every grid point;
    * ``change[method]``: ``(S, 2)`` average feature change of ID and OOD test inputs (FT, LP-FT);
    * ``layer_change[method]``: ``(S, 2, depth + 1)`` relative change of each layer, ID and OOD;
    * ``trace[method]``: ``(S, R, 3)`` training loss, ID and OOD feature change at the recorded
      steps ``trace_steps`` of the chosen run;
    * ``pretrain_loss``: ``(S,)`` the last pretraining mini-batch losses (mean of the final 50).
    """
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")

    def build():
        S = len(cfg.seeds)
        acc = {
            m: torch.zeros(S, 2, dtype=torch.float64)
            for m in ("scratch", "lp", "ft", "lpft")
        }
        chosen = {m: torch.zeros(S, dtype=torch.float64) for m in acc}
        sweep = {
            "scratch": torch.zeros(S, len(cfg.scratch_lrs), 3, dtype=torch.float64),
            "lp": torch.zeros(S, len(cfg.l2s), 3, dtype=torch.float64),
            "ft": torch.zeros(S, len(cfg.lrs), 3, dtype=torch.float64),
            "lpft": torch.zeros(S, len(cfg.lrs), 3, dtype=torch.float64),
        }
        change = {m: torch.zeros(S, 2, dtype=torch.float64) for m in ("ft", "lpft")}
        layer_change = {
            m: torch.zeros(S, 2, cfg.depth + 1, dtype=torch.float64)
            for m in ("ft", "lpft")
        }
        traces, trace_steps = {"ft": [], "lpft": []}, None
        pre_loss = torch.zeros(S, dtype=torch.float64)
        for si, seed in enumerate(progress(cfg.seeds, total=S, desc="worlds")):
            world = StyleShiftWorld(dataclasses.replace(cfg.world, seed=seed))
            encoder, losses = pretrain_encoder(cfg, seed)
            pre_loss[si] = losses[-50:].mean()
            g = make_generator(10_000 + seed)
            train_s, val_s = (
                world.in_distribution(cfg.n_train, g),
                world.in_distribution(cfg.n_val, g),
            )
            id_s, ood_s = (
                world.in_distribution(cfg.n_test, g),
                world.out_of_distribution(cfg.n_test, g),
            )
            track = {"id": id_s.x[: cfg.n_track], "ood": ood_s.x[: cfg.n_track]}
            C = cfg.world.n_classes

            def evaluate(enc, head):
                return {
                    "val": accuracy(enc, head, val_s.x, val_s.labels),
                    "id": accuracy(enc, head, id_s.x, id_s.labels),
                    "ood": accuracy(enc, head, ood_s.x, ood_s.labels),
                }

            # LP: exact regularised logistic regression on frozen features
            with torch.no_grad():
                feats = encoder(train_s.x)
            cands = []
            for l2 in cfg.l2s:
                head = linear_head(*softmax_regression(feats, train_s.labels, C, l2=l2))
                cands.append({**evaluate(encoder, head), "head": head})
            best = _select(cands)
            lp_head = cands[best]["head"]
            _record(acc, chosen, sweep, "lp", si, cands, best, cfg.l2s)

            # FT and LP-FT: the same fine-tuning, from a random head or from the LP head
            for method in ("ft", "lpft"):
                cands = []
                for lr in cfg.lrs:
                    head0 = (
                        random_head(cfg.rep_dim, C, make_generator(20_000 + seed))
                        if method == "ft"
                        else lp_head
                    )
                    res = fine_tune_classifier(
                        encoder,
                        head0,
                        train_s.x,
                        train_s.labels,
                        lr=lr,
                        steps=cfg.ft_steps,
                        momentum=cfg.momentum,
                        track=track,
                        track_every=cfg.track_every,
                    )
                    cands.append({**evaluate(res.encoder, res.head), "res": res})
                best = _select(cands)
                _record(acc, chosen, sweep, method, si, cands, best, cfg.lrs)
                res = cands[best]["res"]
                change[method][si] = torch.tensor(
                    [
                        feature_change(encoder, res.encoder, id_s.x),
                        feature_change(encoder, res.encoder, ood_s.x),
                    ]
                )
                layer_change[method][si, 0] = layer_feature_change(
                    encoder, res.encoder, id_s.x
                )
                layer_change[method][si, 1] = layer_feature_change(
                    encoder, res.encoder, ood_s.x
                )
                traces[method].append(
                    torch.stack(
                        [res.trace["train_loss"], res.trace["id"], res.trace["ood"]], 1
                    )
                )
                trace_steps = res.trace_steps

            # scratch: the same architecture from a random initialisation
            cands = []
            for lr in cfg.scratch_lrs:
                seed_everything(30_000 + seed)
                fresh = build_encoder(cfg)
                head0 = random_head(cfg.rep_dim, C, make_generator(20_000 + seed))
                res = fine_tune_classifier(
                    fresh,
                    head0,
                    train_s.x,
                    train_s.labels,
                    lr=lr,
                    steps=cfg.ft_steps,
                    momentum=cfg.momentum,
                )
                cands.append(evaluate(res.encoder, res.head))
            _record(
                acc,
                chosen,
                sweep,
                "scratch",
                si,
                cands,
                _select(cands),
                cfg.scratch_lrs,
            )
        return {
            "acc": acc,
            "chosen": chosen,
            "sweep": sweep,
            "change": change,
            "layer_change": layer_change,
            "trace": {m: torch.stack(v) for m, v in traces.items()},
            "trace_steps": trace_steps,
            "pretrain_loss": pre_loss,
        }

    return cached(cfg, build, name="ch03_lpft")


def _record(acc, chosen, sweep, method, si, cands, best, grid):
    for j, c in enumerate(cands):
        sweep[method][si, j] = torch.tensor(
            [c["val"], c["id"], c["ood"]], dtype=torch.float64
        )
    acc[method][si] = torch.tensor(
        [cands[best]["id"], cands[best]["ood"]], dtype=torch.float64
    )
    chosen[method][si] = float(grid[best])
