"""Linear probing, fine-tuning and LP-FT for classification, and how far features move.

The methods compared in Chapter 3 (``notebooks/03-lp-vs-ft.ipynb``), after
:cite:t:`kumar2022finetuning`. A pretrained encoder :math:`\\phi_\\theta` and a
linear head :math:`(W, b)` give logits :math:`W\\phi_\\theta(x) + b`; the adaptation
loss is the cross-entropy with label smoothing :math:`\\alpha` on the :math:`n`
labelled ID examples, :math:`\\ell(z, y) = -\\sum_c q_c
\\log\\mathrm{softmax}(z)_c` with :math:`q = (1-\\alpha)e_y + \\alpha/C`.

* **LP** freezes :math:`\\theta` and solves the convex problem
  :math:`\\min_{W,b} \\frac1n\\sum_i \\ell(W\\phi(x_i)+b, y_i)
  + \\lambda\\lVert W\\rVert_F^2` to numerical precision by Newton's method
  (:func:`softmax_regression`).
* **FT** trains :math:`\\theta` and a randomly initialised head together (full-batch SGD
  with momentum on the same loss, :func:`fine_tune_classifier`).
* **LP-FT** runs the same fine-tuning from the LP head.
* **Scratch**, the baseline without pretraining, runs it from a freshly initialised
  encoder and head.

Every hyper-parameter (:math:`\\lambda` for LP, the learning rates of the others) is
chosen by one rule, :func:`select_by_validation`: the most conservative value whose ID
validation accuracy is within one standard error of the highest (the one-standard-error
rule of Breiman et al. 1984; Hastie, Tibshirani and Friedman 2009, Sec. 7.10).

The *feature change* of an input is
:math:`\\lVert\\phi_{\\text{after}}(x) - \\phi_{\\text{before}}(x)\\rVert_2`;
:func:`feature_change` averages it over a set of inputs, and
:func:`matched_loss_change_ratio` compares FT with LP-FT at the same training loss.
:func:`run_lpft_experiment` runs the four methods on many seeds' worlds
(:class:`~fmlab.data.shift.StyleShiftWorld`, whose styles may overlap by an angle
:math:`a`), and :func:`overlap_sweep` at several angles; the chapter's figures are drawn
by :mod:`fmlab.chapters.ch3_figures`, its linear theory is in
:mod:`fmlab.chapters.ch3_linear`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._validate import check_float, check_int, check_same_length, check_tensor
from ..claims import SeedEffect
from ..data.shift import StyleShiftConfig, StyleShiftWorld, sample_worlds
from ..models.mlp import MLP
from ..repro import make_generator, seed_everything
from ..train import cached, progress

__all__ = [
    "softmax_regression",
    "linear_head",
    "random_head",
    "classifier_accuracy",
    "feature_change",
    "layer_feature_change",
    "FineTuneResult",
    "fine_tune_classifier",
    "BatchFineTuneResult",
    "fine_tune_batch",
    "select_by_validation",
    "best_validation",
    "LPFTConfig",
    "SharedStyleConfig",
    "SharedStyleWorld",
    "make_world",
    "with_shared",
    "build_encoder",
    "pretrain_encoders",
    "pretrain_encoder",
    "at_angle",
    "searched",
    "run_lpft_experiment",
    "feature_change_at_loss",
    "matched_loss_change_ratio",
    "overlap_sweep",
    "ORDERINGS",
    "clear_orderings",
    "angles_where",
    "tolerance_moves",
    "probe_contrast",
    "METHODS",
    "FINE_TUNED",
]

#: The three adaptation methods and the baseline trained from scratch, in the order
#: the chapter lists them.
METHODS = ("lp", "ft", "lpft", "scratch")
#: The methods that fine-tune the pretrained encoder.
FINE_TUNED = ("ft", "lpft")
_NAMES = {"lp": "LP", "ft": "FT", "lpft": "LP-FT", "scratch": "scratch"}


# -- linear probing -------------------------------------------------------------------
def _soft_targets(labels, n_classes, label_smoothing):
    onehot = F.one_hot(labels, n_classes).double()
    return (1 - label_smoothing) * onehot + label_smoothing / n_classes


def _softmax_objective(theta, Ft, Y, l2, k):
    logp = torch.log_softmax(Ft @ theta.T, dim=1)
    return -(Y * logp).sum(1).mean() + l2 * theta[:, :k].pow(2).sum()


def softmax_regression(
    features: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    *,
    l2: float,
    label_smoothing: float = 0.0,
    init: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_iter: int = 100,
    tol: float = 1e-9,
) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-regularised multinomial logistic regression, solved by Newton's method.

    Minimises :math:`\\frac1n\\sum_i \\ell(W f_i + b, y_i)
    + \\lambda\\lVert W\\rVert_F^2` (the bias is not penalised), where :math:`\\ell` is
    the cross-entropy against the smoothed targets
    :math:`q_i = (1-\\alpha)e_{y_i} + \\alpha/C` (``label_smoothing`` :math:`\\alpha`;
    0 gives the ordinary cross-entropy). With :math:`P` the softmax probabilities and
    :math:`\\tilde f = (f, 1)`, the gradient is :math:`\\frac1n (P - Q)^\\top \\tilde F`
    plus :math:`2\\lambda W`, and the Hessian block of classes :math:`(a, b)` is
    :math:`\\frac1n\\sum_i (P_{ia}\\delta_{ab} - P_{ia}P_{ib})\\,
    \\tilde f_i\\tilde f_i^\\top` plus :math:`2\\lambda I` on the weights. Newton steps
    with a backtracking line search stop when the gradient's norm is below ``tol``.
    ``init = (W, b)`` warm-starts the solver (the solution does not depend on it).

    Returns ``(W, b)`` of shapes ``(n_classes, k)`` and ``(n_classes,)``, float64.
    """
    features = check_tensor("features", features, ndim=2, floating=True)
    labels = check_tensor("labels", labels, ndim=1, integer=True)
    n = check_same_length(("features", "labels"), features, labels)
    C = check_int("n_classes", n_classes, minimum=2)
    l2 = check_float("l2", l2, minimum=0.0)
    alpha = check_float("label_smoothing", label_smoothing, minimum=0.0, maximum=1.0)
    max_iter = check_int("max_iter", max_iter, minimum=1)
    tol = check_float("tol", tol, minimum=0.0, strict_min=True)
    if n == 0:
        raise ValueError("features must have at least one row")
    if int(labels.min()) < 0 or int(labels.max()) >= C:
        raise ValueError(
            f"labels must lie in [0, {C - 1}], got range "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    k = features.shape[1]
    Ft = torch.cat([features.double(), torch.ones(n, 1, dtype=torch.float64)], dim=1)
    Y = _soft_targets(labels, C, alpha)
    reg = torch.zeros(C, k + 1, dtype=torch.float64)
    reg[:, :k] = 2 * l2
    theta = torch.zeros(C, k + 1, dtype=torch.float64)
    if init is not None:
        W0 = check_tensor("init[0]", init[0], shape=(C, k), floating=True)
        b0 = check_tensor("init[1]", init[1], shape=(C,), floating=True)
        theta = torch.cat([W0.double(), b0.double()[:, None]], dim=1)
    size = C * (k + 1)
    pair_a, pair_b = torch.triu_indices(C, C)  # the blocks (a, b), a <= b
    same = (pair_a == pair_b).double()
    FtT = Ft.T.contiguous()
    for _ in range(max_iter):
        P = torch.softmax(Ft @ theta.T, dim=1)
        grad = (P - Y).T @ Ft / n + reg * theta
        if float(grad.norm()) < tol:
            break
        # block (a, b) of the Hessian is Ft^T diag(P_a δ_ab - P_a P_b) Ft / n: the
        # C (C + 1) / 2 blocks on and above the diagonal in one matrix product (half
        # the work of forming the whole Hessian), the others by symmetry
        weights = P[:, pair_a] * (same - P[:, pair_b])  # (n, pairs)
        weighted = (Ft.unsqueeze(1) * weights.unsqueeze(2)).reshape(n, -1)
        blocks = (FtT @ weighted / n).view(k + 1, -1, k + 1)  # (k + 1, pairs, k + 1)
        H = torch.empty(C, k + 1, C, k + 1, dtype=torch.float64)
        for i, (a, b) in enumerate(zip(pair_a.tolist(), pair_b.tolist())):
            H[a, :, b] = blocks[:, i]
            H[b, :, a] = blocks[:, i].T
        H = H.reshape(size, size)
        H += torch.diag(reg.flatten())
        # shifting every class's bias by the same constant leaves the loss unchanged:
        # a tiny ridge fixes that null direction
        ridge = 1e-10 * max(1.0, float(H.diagonal().max()))
        H += ridge * torch.eye(size, dtype=torch.float64)
        # H is positive definite (a convex loss's Hessian plus the ridge): Cholesky,
        # with LU as the fallback should rounding defeat it
        L, info = torch.linalg.cholesky_ex(H)
        rhs = grad.reshape(size, 1)
        if int(info) == 0:
            step = torch.cholesky_solve(rhs, L).reshape(C, k + 1)
        else:
            step = torch.linalg.solve(H, rhs).reshape(C, k + 1)
        f0 = float(_softmax_objective(theta, Ft, Y, l2, k))
        slope = float((grad * step).sum())
        t = 1.0
        while t > 1e-12:
            cand = theta - t * step
            if float(_softmax_objective(cand, Ft, Y, l2, k)) <= f0 - 1e-4 * t * slope:
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
    """A freshly initialised head, as in ordinary fine-tuning.

    Entries are uniform in :math:`\\pm 1/\\sqrt{k}` (PyTorch's default for
    ``nn.Linear``), drawn from ``generator``.
    """
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
def classifier_accuracy(
    encoder: nn.Module, head: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> float:
    """Fraction of ``x`` whose predicted class ``argmax head(encoder(x))`` is ``y``."""
    x = check_tensor("x", x, ndim=2, floating=True)
    y = check_tensor("y", y, ndim=1, integer=True)
    check_same_length(("x", "y"), x, y)
    return float((head(encoder(x)).argmax(1) == y).double().mean())


@torch.no_grad()
def feature_change(before: nn.Module, after: nn.Module, x: torch.Tensor) -> float:
    """The average :math:`\\ell_2` feature change of the inputs ``x``.

    That is :math:`\\frac1n\\sum_i\\lVert\\phi_{\\text{after}}(x_i) -
    \\phi_{\\text{before}}(x_i)\\rVert_2`.
    """
    x = check_tensor("x", x, ndim=2, floating=True)
    if len(x) == 0:
        raise ValueError("x must have at least one row")
    return float((after(x) - before(x)).norm(dim=1).mean())


@torch.no_grad()
def layer_feature_change(before: MLP, after: MLP, x: torch.Tensor) -> torch.Tensor:
    """Relative change of every hidden layer's output (after each ReLU) of an encoder.

    Entry :math:`l` is :math:`\\mathrm{mean}_i\\lVert h^{\\text{after}}_l(x_i) -
    h^{\\text{before}}_l(x_i)\\rVert / \\mathrm{mean}_i\\lVert
    h^{\\text{before}}_l(x_i)\\rVert`; the last entry is the representation. ``before``
    and ``after`` are :class:`~fmlab.models.mlp.MLP` encoders of the same shape.
    """
    if not (isinstance(before, MLP) and isinstance(after, MLP)):
        raise TypeError("before and after must be fmlab MLP encoders")
    x = check_tensor("x", x, ndim=2, floating=True)
    out = []
    a, b = x, x
    for m0, m1 in zip(before.net, after.net):
        a, b = m0(a), m1(b)
        if isinstance(m0, nn.ReLU):
            rel = (b - a).norm(dim=1).mean() / a.norm(dim=1).mean().clamp_min(1e-12)
            out.append(float(rel))
    return torch.tensor(out, dtype=torch.float64)


# -- fine-tuning ----------------------------------------------------------------------
@dataclass
class FineTuneResult:
    """What :func:`fine_tune_classifier` returns.

    ``train_loss`` holds the training loss before every step and after the last;
    ``trace`` holds, at the steps ``trace_steps``, the training loss and the average
    feature change of every tracked set of inputs (name -> tensor). ``diverged`` is
    true when the loss stopped being finite (training stops there).
    """

    encoder: nn.Module
    head: nn.Linear
    train_loss: torch.Tensor
    trace_steps: torch.Tensor
    trace: dict = field(default_factory=dict)
    diverged: bool = False


def fine_tune_classifier(
    encoder: nn.Module,
    head: nn.Linear,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    steps: int,
    momentum: float = 0.9,
    label_smoothing: float = 0.0,
    track: dict | None = None,
    track_every: int = 10,
) -> FineTuneResult:
    """Train copies of ``encoder`` and ``head`` on the cross-entropy of ``(x, y)``.

    Full-batch SGD with momentum over every parameter, for ``steps`` steps, on the
    cross-entropy with ``label_smoothing``. FT passes a :func:`random_head`, LP-FT the
    LP head. ``track`` maps names to input tensors whose average feature change (from
    the starting encoder) is recorded every ``track_every`` steps, together with the
    training loss.
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
    alpha = check_float("label_smoothing", label_smoothing, minimum=0.0, maximum=1.0)
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
    losses = torch.full((steps + 1,), float("nan"))
    rec_steps, rec = [], {"train_loss": [], **{name: [] for name in track}}
    diverged = False
    for step in range(steps + 1):
        loss = F.cross_entropy(hd(enc(x)), y, label_smoothing=alpha)
        losses[step] = loss.detach()
        if not math.isfinite(float(loss.detach())):
            diverged = True
            break
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
        enc, hd, losses, torch.tensor(rec_steps, dtype=torch.long), trace, diverged
    )


@dataclass
class BatchFineTuneResult:
    """What :func:`fine_tune_batch` returns: ``G`` runs, as in :class:`FineTuneResult`.

    ``encoders[g]`` and ``heads[g]`` are the trained modules of run ``g``;
    ``train_loss`` is ``(G, steps + 1)``; ``trace`` maps names to ``(G, R)`` tensors at
    the steps ``trace_steps``; ``diverged`` is a ``(G,)`` bool tensor.
    """

    encoders: list
    heads: list
    train_loss: torch.Tensor
    trace_steps: torch.Tensor
    trace: dict
    diverged: torch.Tensor


def _mlp_layers(encoder):
    layers = [m for m in encoder.net if isinstance(m, nn.Linear)]
    kinds = [type(m) for m in encoder.net]
    want = []
    for _ in layers:
        want += [nn.Linear, nn.ReLU]
    if kinds != want:
        raise ValueError(
            "encoder must be an MLP of Linear layers each followed by a ReLU "
            "(final_activation=True)"
        )
    return layers


def fine_tune_batch(
    encoder: MLP,
    heads: Sequence[nn.Linear],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lrs: Sequence[float],
    steps: int,
    momentum: float = 0.9,
    label_smoothing: float = 0.0,
    track: dict | None = None,
    track_every: int = 10,
) -> BatchFineTuneResult:
    """``G = len(heads)`` runs of :func:`fine_tune_classifier` from one encoder at once.

    Run ``g`` starts from ``encoder`` and ``heads[g]`` and uses learning rate
    ``lrs[g]``; every other argument is shared. The ``G`` copies are stacked along a
    leading axis and trained together with batched matrix products; since the summed
    loss has a block-diagonal gradient, each run follows exactly the updates of
    :func:`fine_tune_classifier` (full-batch SGD with momentum, PyTorch's convention
    :math:`m \\leftarrow \\mu m + g`, :math:`\\theta \\leftarrow \\theta - \\eta m`),
    up to floating-point summation order. When the training inputs span fewer than all
    input directions, the first layer is trained inside their span (the span lemma;
    the parts of the inputs below ``1e-5`` of their largest singular value, rounding
    error for inputs drawn in a subspace, are dropped). ``encoder`` must be an
    :class:`MLP` whose every Linear layer is followed by a ReLU, as
    :func:`build_encoder` makes. A run whose loss stops being finite is frozen there
    and flagged in ``diverged``.
    """
    if not isinstance(encoder, MLP):
        raise TypeError(f"encoder must be an fmlab MLP, got {type(encoder).__name__}")
    layers = _mlp_layers(encoder)
    heads = list(heads)
    if not heads or not all(isinstance(h, nn.Linear) for h in heads):
        raise TypeError("heads must be a non-empty sequence of torch.nn.Linear")
    G = len(heads)
    lrs = [check_float("lrs", v, minimum=0.0, strict_min=True) for v in lrs]
    if len(lrs) != G:
        raise ValueError(f"lrs must have one entry per head, got {len(lrs)} and {G}")
    x = check_tensor("x", x, shape=(None, encoder.dims[0]), floating=True)
    y = check_tensor("y", y, ndim=1, integer=True)
    check_same_length(("x", "y"), x, y)
    steps = check_int("steps", steps, minimum=0)
    momentum = check_float("momentum", momentum, minimum=0.0, maximum=1.0)
    alpha = check_float("label_smoothing", label_smoothing, minimum=0.0, maximum=1.0)
    track_every = check_int("track_every", track_every, minimum=1)
    track = dict(track or {})
    for name, xs in track.items():
        check_tensor(
            f"track[{name!r}]", xs, shape=(None, encoder.dims[0]), floating=True
        )
    C = heads[0].out_features
    if any(h.weight.shape != heads[0].weight.shape for h in heads):
        raise ValueError("heads must all have the same shape")

    def stack(t):
        return t.detach().float().unsqueeze(0).repeat(G, *([1] * t.ndim)).clone()

    # parameters, each (G, ...), weights in nn.Linear's (out, in) layout. Activations
    # are kept feature-major, (G, features, examples): with only C classes in the
    # head, PyTorch's batched products are several times faster in this layout than
    # in the example-major one (measured: 0.19 ms against 1.1 ms for the head's
    # forward product at G = 20, 384 examples, 128 features, 4 classes, one thread).
    #
    # The span lemma (ch3-lem-span): the first layer's gradient is a combination of
    # the training inputs, so its weights only ever move inside their row space. When
    # that space is smaller than the input (the chapter's ID inputs lie in their
    # style's content subspace), the first layer is trained as W0 + M Qᵀ, Q an
    # orthonormal basis of the row space and M starting at 0: the same updates (the
    # gradient in M is the gradient in W times Q, and Qᵀ Q = I), at r/d of the cost
    W0 = layers[0].weight.detach().float()
    Q = _row_space(x)  # (d, r), or None when the inputs span every direction
    params = []
    for i, lin in enumerate(layers):
        if i == 0 and Q is not None:
            params.append(torch.zeros(G, W0.shape[0], Q.shape[1]))
        else:
            params.append(stack(lin.weight))
        params.append(None if lin.bias is None else stack(lin.bias))
    params.append(torch.stack([h.weight.detach().float() for h in heads]).clone())
    params.append(torch.stack([h.bias.detach().float() for h in heads]).clone())
    rate = torch.tensor(lrs, dtype=torch.float32)
    active = torch.ones(G, dtype=torch.bool)
    n_layers = len(layers)

    def first_layer_input(inp):
        """What the first layer needs of ``inp`` (n, d), the same for every run: W0 xᵀ
        and the coordinates Qᵀ xᵀ (reparametrised), or xᵀ (not)."""
        xT = inp.T.contiguous()
        if Q is None:
            return None, xT
        return W0 @ xT, (Q.T @ xT).contiguous()

    def features(packed, s, e, out=None):
        """Every layer's output for the runs ``s:e``, each (runs, features, examples),
        on the inputs of ``packed``, written into the buffers ``out`` if given. The
        first layer's input is the same for every run: its products are one matrix
        product of the stacked weights."""
        fixed, z = packed
        acts = []
        for i in range(n_layers):
            W, b = params[2 * i][s:e], params[2 * i + 1]
            b = None if b is None else b[s:e, :, None]
            buf = None if out is None else out[i][s:e]
            if i == 0:
                flat = None if buf is None else buf.view(-1, z.shape[1])
                h = torch.mm(W.reshape(-1, W.shape[2]), z, out=flat)
                h = h.view(e - s, W.shape[1], z.shape[1])
                if fixed is not None:
                    h.add_(fixed)
                if b is not None:
                    h.add_(b)
            elif b is None:
                h = torch.bmm(W, acts[-1], out=buf)
            else:
                h = torch.baddbmm(b, W, acts[-1], out=buf)
            acts.append(h.relu_())
        return acts  # the last is the representation, (runs, k, examples)

    # The gradient of the summed loss, written out (each run's gradient is its own
    # block), into buffers allocated once, a few runs at a time: with no autograd
    # graph, no fresh (G, features, examples) tensors at every step and each group's
    # activations still in the cache when they are used again, a step costs about
    # half as much. With P the softmax of the logits and q the smoothed targets, the
    # gradient of a run's loss in its logits is (P - q)/n, formed as autograd forms
    # it (g - P Σ_c g_c, with g = -q/n); each layer then passes it back through its
    # ReLU (whose output is >= 0, so its sign is the 0/1 mask) and its weights.
    train_in = first_layer_input(x)
    m = x.shape[0]
    sizes = [lin.out_features for lin in layers]
    act_bufs = [torch.empty(G, k, m) for k in sizes]
    back_bufs = [torch.empty(G, k, m) for k in sizes]
    mask_bufs = [torch.empty(G, k, m) for k in sizes]
    grads = [None if p is None else torch.empty_like(p) for p in params]
    moms = [None if p is None else torch.zeros_like(p) for p in params]
    group = max(1, (1 << 18) // (max(sizes) * m))  # runs whose activations fill ~1 MB
    groups = [(s, min(G, s + group)) for s in range(0, G, group)]
    track_in = {name: first_layer_input(xs) for name, xs in track.items()}
    with torch.no_grad():
        base = {name: encoder(xs).T for name, xs in track.items()}
    losses = torch.full((G, steps + 1), float("nan"))
    rec_steps, rec = [], {"train_loss": [], **{name: [] for name in track}}
    targets = ((1 - alpha) * F.one_hot(y, C).float() + alpha / C).T  # (C, m)
    g_logp = targets * (-1.0 / m)  # the gradient of a run's loss in its log-probs
    g_sum = g_logp.sum(0)
    cur = torch.empty(G)
    for step in range(steps + 1):
        for s, e in groups:
            acts = features(train_in, s, e, act_bufs)
            logits = torch.baddbmm(params[-1][s:e, :, None], params[-2][s:e], acts[-1])
            logp = torch.log_softmax(logits, dim=1)  # (runs, C, m)
            cur[s:e] = -(logp * targets).sum(1).mean(-1)
            active[s:e] &= torch.isfinite(cur[s:e])
            if step == steps:
                continue
            d_logits = g_logp - logp.exp_() * g_sum
            d_logits = torch.where(active[s:e, None, None], d_logits, 0.0)
            torch.bmm(d_logits, acts[-1].transpose(1, 2), out=grads[-2][s:e])
            torch.sum(d_logits, -1, out=grads[-1][s:e])
            d = torch.bmm(
                params[-2][s:e].transpose(1, 2), d_logits, out=back_bufs[-1][s:e]
            )
            for i in reversed(range(n_layers)):
                d.mul_(torch.sign(acts[i], out=mask_bufs[i][s:e]))  # the ReLU
                if params[2 * i + 1] is not None:
                    torch.sum(d, -1, out=grads[2 * i + 1][s:e])
                if i == 0:
                    z = train_in[1]
                    out = grads[0][s:e].view(-1, z.shape[0])
                    torch.mm(d.view(-1, m), z.T, out=out)
                else:
                    torch.bmm(d, acts[i - 1].transpose(1, 2), out=grads[2 * i][s:e])
                    d = torch.bmm(
                        params[2 * i][s:e].transpose(1, 2), d, out=back_bufs[i - 1][s:e]
                    )
        losses[:, step] = torch.where(active, cur, float("nan"))
        if track and (step % track_every == 0 or step == steps):
            rec_steps.append(step)
            rec["train_loss"].append(losses[:, step].clone())
            for name in track:
                diff = features(track_in[name], 0, G)[-1].sub_(base[name])
                d = diff.square_().sum(1).sqrt_().mean(-1)  # mean ‖Δφ(x)‖
                rec[name].append(torch.where(active, d, float("nan")))
        if step == steps:
            break
        # SGD with momentum (PyTorch's convention); a run that stopped being finite
        # is frozen
        eta = torch.where(active, rate, 0.0)
        for p, mom, g in zip(params, moms, grads):
            if p is None:
                continue
            shape = (-1,) + (1,) * (p.ndim - 1)
            g.nan_to_num_().mul_(active.view(shape))
            mom.mul_(momentum).add_(g)
            p.sub_(eta.view(shape) * mom)
    encoders, out_heads = [], []
    for g in range(G):
        enc = copy.deepcopy(encoder)
        with torch.no_grad():
            for i, lin in enumerate(_mlp_layers(enc)):
                W = params[2 * i][g]
                lin.weight.copy_(W0 + W @ Q.T if i == 0 and Q is not None else W)
                if lin.bias is not None:
                    lin.bias.copy_(params[2 * i + 1][g])
        enc.eval()
        head = nn.Linear(params[-2].shape[2], C)
        with torch.no_grad():
            head.weight.copy_(params[-2][g])
            head.bias.copy_(params[-1][g])
        encoders.append(enc)
        out_heads.append(head)
    trace = {k: torch.stack(v, 1).double() for k, v in rec.items()} if track else {}
    return BatchFineTuneResult(
        encoders,
        out_heads,
        losses,
        torch.tensor(rec_steps, dtype=torch.long),
        trace,
        ~active,
    )


def _row_space(x: torch.Tensor, rtol: float = 1e-5) -> torch.Tensor | None:
    """An orthonormal basis ``(d, r)`` of the span of the rows of ``x`` ``(n, d)``
    (singular values above ``rtol`` times the largest), or ``None`` when ``r = d``."""
    _, s, Vh = torch.linalg.svd(x.double(), full_matrices=False)
    r = int((s > rtol * s[0]).sum()) if len(s) and float(s[0]) > 0 else 0
    if r >= x.shape[1] or r == 0:
        return None
    return Vh[:r].T.float().contiguous()


def select_by_validation(
    scores: Sequence[float], order: Sequence[int], tolerance: float = 0.0
) -> int:
    """The book's selection rule: the best validation score, ties to the conservative.

    ``scores[i]`` is the ID validation accuracy of grid value ``i``; ``order`` lists the
    grid indices from the most conservative value to the least (for a learning rate:
    smallest first; for a regularisation strength: largest first). Returns the first
    index in ``order`` whose score is within ``tolerance`` of the highest score (with
    ``tolerance = 0``: the best, and among equal scores the most conservative). A NaN
    score (a diverged run) is never chosen unless all are NaN.
    """
    tolerance = check_float("tolerance", tolerance, minimum=0.0)
    scores = [float(s) for s in scores]
    order = [check_int("order", i, minimum=0, maximum=len(scores) - 1) for i in order]
    if not scores:
        raise ValueError("scores must not be empty")
    if sorted(order) != list(range(len(scores))):
        raise ValueError(
            f"order must be a permutation of range({len(scores)}), got {order}"
        )

    def key(i):
        s = scores[i]
        return -math.inf if math.isnan(s) else s

    best = max(key(i) for i in order)
    return next(i for i in order if key(i) >= best - tolerance)


def _tolerance(cfg, scores) -> float:
    """The rule's tolerance for one search: ``cfg.select_se`` binomial standard errors
    of the best validation accuracy in ``scores`` (NaN: a run that diverged)."""
    top = max((float(v) for v in scores if not math.isnan(float(v))), default=0.0)
    return cfg.select_se * math.sqrt(top * (1 - top) / cfg.n_val)


def _conservative_order(method: str, size: int) -> list:
    """Grid indices from the most conservative value: the largest λ for LP, the
    smallest learning rate for the others."""
    order = list(range(size))
    return order[::-1] if method == "lp" else order


def _span_features(first, Q, shared, enc):
    """The features of the fine-tuned encoder ``enc`` on the input sets of ``shared``,
    through the span ``Q`` (orthonormal columns) of the training inputs. Fine-tuning
    moves the first layer's weight only inside that span (the span lemma;
    :func:`fine_tune_batch` trains it as ``B0 + M Q^T``), so its output on ``x`` is
    ``B0 x + b + ((B - B0) Q)(Q^T x)`` with ``b`` its bias, if any. ``first`` is the
    pretrained first layer (``B0``, ``b0``), and ``shared`` holds
    ``(B0 x + b0, Q^T x)`` for each input set."""
    with torch.no_grad():
        layer, rest = enc.net[0], enc.net[1:]
        C = (layer.weight - first.weight) @ Q
        out = []
        for pre, proj in shared:
            h = torch.addmm(pre, proj, C.T)  # one pass over the (n, k) outputs
            if layer.bias is not None:
                h += layer.bias - first.bias
            if len(rest) and isinstance(rest[0], nn.ReLU):  # in place: h is ours
                out.append(rest[1:](h.relu_()))
            else:
                out.append(rest(h))
        return out


# -- a world with shared and style-specific content -----------------------------------
@dataclass(frozen=True)
class SharedStyleConfig(StyleShiftConfig):
    """A :class:`~fmlab.data.shift.StyleShiftConfig` with a second knob: the fraction
    ``shared_fraction`` :math:`\\rho` of the content directions that every style
    renders identically (:class:`SharedStyleWorld`). ``overlap_deg`` (``None``:
    :math:`90°`) is the overlap angle of the other, style-specific, directions."""

    shared_fraction: float = 0.5
    specific_rule_scale: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check_float("shared_fraction", self.shared_fraction, minimum=0.0, maximum=1.0)
        check_float("specific_rule_scale", self.specific_rule_scale, minimum=0.0)
        J, p = self.n_styles, self.dim_content
        if (J + 1) * p > self.dim_input:
            raise ValueError(
                "a shared-content world needs (n_styles + 1) * dim_content <= "
                f"dim_input, got ({J} + 1) * {p} > {self.dim_input}"
            )

    @property
    def n_shared(self) -> int:
        """:math:`p_s = \\mathrm{round}(\\rho p)`, the number of shared directions."""
        return round(self.shared_fraction * self.dim_content)


class SharedStyleWorld(StyleShiftWorld):
    """The style-shift world with shared and style-specific content directions.

    With :math:`U, Q_0, \\dots, Q_{J-1}` mutually orthogonal :math:`p`-frames (the
    frames of :class:`~fmlab.data.shift.StyleShiftWorld`'s overlap construction, drawn
    from the same seed), the first :math:`p_s` content coordinates are rendered by the
    columns of :math:`U` in every style, and coordinate :math:`c \\ge p_s` of style
    :math:`j` by :math:`\\cos(a)\\,U_{:c} + \\sin(a)\\,(Q_j)_{:c}`. Then

    .. math::
        R_0^\\top R_j = \\mathrm{diag}(I_{p_s},\\ \\cos^2(a)\\, I_{p - p_s}),
        \\qquad j \\ne 0 :

    the shared part of an OOD input is exactly that of the ID input with the same
    content, and its specific part overlaps by :math:`\\cos^2 a` (0 at the default
    :math:`a = 90°`). :math:`\\rho = 0` is the overlap world itself (the same frames,
    type means and rule); :math:`\\rho = 1` has no shift. Used in Chapter 3.
    """

    def __init__(self, config: SharedStyleConfig):
        if not isinstance(config, SharedStyleConfig):
            raise TypeError(
                f"config must be a SharedStyleConfig, got {type(config).__name__}"
            )
        super().__init__(config)  # the type means and the rule, as in the base world
        c, p, ps = config, config.dim_content, config.n_shared
        g = make_generator(c.seed)  # the base world's first draw: its frames
        q, _ = torch.linalg.qr(
            torch.randn(c.dim_input, c.dim_input, generator=g, dtype=torch.float64)
        )
        a = math.radians(90.0 if c.overlap_deg is None else c.overlap_deg)
        U = q[:, :p]
        frames = []
        for j in range(c.n_styles):
            R = math.cos(a) * U + math.sin(a) * q[:, (j + 1) * p : (j + 2) * p]
            R[:, :ps] = U[:, :ps]
            frames.append(R)
        self.render = torch.stack(frames)
        self._render_all = torch.cat(list(self.render), dim=1)
        self.rule = self.rule.clone()
        self.rule[:, ps:] *= c.specific_rule_scale

    def overlap(self) -> float:
        """:math:`\\mathrm{tr}(R_0^\\top R_j)/p = (p_s + (p - p_s)\\cos^2 a)/p`, the
        share of an OOD input's content energy that lies in the ID inputs' span."""
        c = self.config
        a = 90.0 if c.overlap_deg is None else c.overlap_deg
        cos2 = 0.0 if a == 90.0 else math.cos(math.radians(a)) ** 2
        return (c.n_shared + (c.dim_content - c.n_shared) * cos2) / c.dim_content

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", shared={self.config.n_shared})"


def make_world(config: StyleShiftConfig) -> StyleShiftWorld:
    """The world of ``config``: a :class:`SharedStyleWorld` for a
    :class:`SharedStyleConfig`, else a :class:`~fmlab.data.shift.StyleShiftWorld`."""
    if isinstance(config, SharedStyleConfig):
        return SharedStyleWorld(config)
    return StyleShiftWorld(config)


def with_shared(
    cfg: "LPFTConfig", rho: float, angle: float | None = None, **changes
) -> "LPFTConfig":
    """``cfg`` in a shared-content world: a fraction ``rho`` of the content directions
    shared by every style, the rest at the overlap angle ``angle`` (degrees; ``None``:
    orthogonal), and any other field replaced by ``changes``."""
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    cfg = dataclasses.replace(cfg, **changes)
    fields = {
        f.name: getattr(cfg.world, f.name) for f in dataclasses.fields(StyleShiftConfig)
    }
    fields.update(overlap_deg=None if angle is None else float(angle))
    return dataclasses.replace(
        cfg, world=SharedStyleConfig(**fields, shared_fraction=float(rho))
    )


# -- the experiment -------------------------------------------------------------------
@dataclass(frozen=True)
class LPFTConfig:
    """Everything that determines Chapter 3's nonlinear experiment.

    Each seed draws its own world (``world`` with ``seed`` replaced), pretrains its own
    encoder on the source distribution, and draws its own ID and OOD data.

    The encoder is an MLP ``dim_input -> width (x depth) -> rep_dim`` with ReLUs and a
    bias-free first layer; ``depth = 0`` is the network of the linear theory with a
    ReLU, :math:`\\phi(x) = \\mathrm{ReLU}(Bx)`. After pretraining, its last layer is
    rescaled so that the features have average norm ``feature_norm`` on the source
    distribution (``None``: keep the pretrained scale). ``lrs`` is the learning-rate
    grid of FT and LP-FT, ``l2s`` LP's grid of :math:`\\lambda`; the *scratch* baseline
    (the same encoder from PyTorch's default initialisation and a random head, trained
    like FT for ``scratch_steps`` steps) searches ``scratch_lrs``. Every method takes
    the most conservative grid value (the largest :math:`\\lambda`, the smallest
    learning rate) whose ID validation accuracy is within ``select_se`` standard errors
    of the best one's, :math:`\\sqrt{p(1-p)/n_{\\text{val}}}` at the best accuracy
    :math:`p` (``select_se = 0``: the best, exact ties to the conservative). FT is run
    from ``ft_heads`` random heads at every learning rate; its accuracies are their
    means, and one rate is chosen for all of them by the mean validation accuracy. FT
    searches only the rates of ``lrs`` from ``ft_min_lr`` up (:func:`searched`; its
    entries at smaller rates are NaN), LP-FT all of them. The defaults are the chapter's
    design (``notebooks/03-lp-vs-ft.ipynb``) at an overlap angle of 75°.
    """

    world: StyleShiftConfig = field(
        default_factory=lambda: StyleShiftConfig(dim_input=80, overlap_deg=75.0)
    )
    depth: int = 0
    width: int = 128
    rep_dim: int = 128
    feature_norm: float | None = 0.5
    pretrain_steps: int = 500
    pretrain_batch: int = 256
    pretrain_lr: float = 3e-3
    label_smoothing: float = 0.1
    n_train: int = 384
    n_val: int = 10_000
    n_test: int = 10_000
    ft_steps: int = 200
    momentum: float = 0.9
    lrs: tuple = (3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
    l2s: tuple = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
    scratch_lrs: tuple = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
    scratch_steps: int = 200
    select_se: float = 1.0
    ft_heads: int = 2
    ft_min_lr: float = 1e-4
    seeds: tuple = tuple(range(10))
    n_track: int = 250
    track_every: int = 10

    def __post_init__(self):
        if not isinstance(self.world, StyleShiftConfig):
            raise TypeError(
                f"world must be a StyleShiftConfig, got {type(self.world).__name__}"
            )
        check_int("depth", self.depth, minimum=0)
        for name in (
            "width",
            "rep_dim",
            "pretrain_steps",
            "pretrain_batch",
            "n_train",
            "n_val",
            "n_test",
            "ft_steps",
            "scratch_steps",
            "n_track",
            "track_every",
            "ft_heads",
        ):
            check_int(name, getattr(self, name), minimum=1)
        if self.feature_norm is not None:
            check_float("feature_norm", self.feature_norm, minimum=0.0, strict_min=True)
        check_float("pretrain_lr", self.pretrain_lr, minimum=0.0, strict_min=True)
        check_float("label_smoothing", self.label_smoothing, minimum=0.0, maximum=1.0)
        check_float("momentum", self.momentum, minimum=0.0, maximum=1.0)
        check_float("select_se", self.select_se, minimum=0.0)
        for name in ("lrs", "l2s", "scratch_lrs", "seeds"):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty tuple")
        for name in ("lrs", "l2s", "scratch_lrs"):
            grid = getattr(self, name)
            for v in grid:
                check_float(name, v, minimum=0.0, strict_min=name != "l2s")
            if list(grid) != sorted(set(grid)):
                raise ValueError(f"{name} must be strictly increasing, got {grid}")
        for s in self.seeds:
            check_int("seeds", s, minimum=0)
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct, got {self.seeds}")
        check_float("ft_min_lr", self.ft_min_lr, minimum=0.0)
        if sum(lr >= self.ft_min_lr for lr in self.lrs) < 2:
            raise ValueError(
                "ft_min_lr must leave FT at least two rates of lrs, got "
                f"{self.ft_min_lr}"
            )
        if self.n_track > self.n_test:
            raise ValueError(
                f"n_track must be <= n_test, got {self.n_track} > {self.n_test}"
            )


def searched(cfg: LPFTConfig, method: str) -> list:
    """The grid indices that ``method`` searches: all of ``cfg.l2s`` for LP, of
    ``cfg.scratch_lrs`` for scratch and of ``cfg.lrs`` for LP-FT, and for FT the rates
    of ``cfg.lrs`` from ``cfg.ft_min_lr`` up."""
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "ft":
        return [j for j, lr in enumerate(cfg.lrs) if lr >= cfg.ft_min_lr]
    grid = {"lp": cfg.l2s, "scratch": cfg.scratch_lrs}.get(method, cfg.lrs)
    return list(range(len(grid)))


def at_angle(cfg: LPFTConfig, angle: float | None, **changes) -> LPFTConfig:
    """``cfg`` with the world's overlap angle set to ``angle`` (degrees; ``None``:
    orthogonal styles) and any other field replaced by ``changes``."""
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    angle = None if angle is None else float(angle)
    cfg = dataclasses.replace(cfg, **changes)
    return dataclasses.replace(
        cfg, world=dataclasses.replace(cfg.world, overlap_deg=angle)
    )


def build_encoder(cfg: LPFTConfig) -> MLP:
    """The encoder :math:`\\phi_\\theta`: an MLP with ReLUs and a bias-free first layer.

    Without a bias the first layer is linear, as in the theory: its response to an
    input direction that no training input has is frozen by fine-tuning.
    """
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    enc = MLP(
        [cfg.world.dim_input] + [cfg.width] * cfg.depth + [cfg.rep_dim],
        final_activation=True,
    )
    out = cfg.width if cfg.depth > 0 else cfg.rep_dim
    enc.net[0] = nn.Linear(cfg.world.dim_input, out, bias=False)
    return enc


@dataclass(frozen=True)
class _PretrainKey:
    world: StyleShiftConfig
    seeds: tuple
    depth: int
    width: int
    rep_dim: int
    steps: int
    batch: int
    lr: float


def _linears(model: nn.Module) -> list:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def pretrain_encoders(
    cfg: LPFTConfig, seeds: Sequence[int]
) -> tuple[list[MLP], torch.Tensor]:
    """Pretrain (or load from the cache) the encoders of the worlds ``seeds``.

    The pretraining task is to classify the object type from inputs of every style,
    with a linear head on :math:`\\phi_\\theta` and Adam on fresh mini-batches. The
    models of all seeds are trained together, their weights stacked along a leading
    axis and multiplied in batches; each seed keeps its own initialisation, data stream
    and Adam state, so each follows exactly the updates of training it alone. Each
    encoder's last layer is then rescaled (a positive factor, which ReLU commutes with)
    so that the average feature norm on 4096 fresh source inputs is
    ``cfg.feature_norm``; the cache holds the unscaled encoders, so configurations that
    differ only in ``feature_norm`` share them. Returns the encoders (in eval mode) and
    the ``(S, pretrain_steps)`` mini-batch pretraining losses.
    """
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    seeds = tuple(check_int("seeds", s, minimum=0) for s in seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    key = _PretrainKey(
        dataclasses.replace(cfg.world, seed=0),
        seeds,
        cfg.depth,
        cfg.width,
        cfg.rep_dim,
        cfg.pretrain_steps,
        cfg.pretrain_batch,
        cfg.pretrain_lr,
    )

    def build():
        worlds, gens, models = [], [], []
        for seed in seeds:
            seed_everything(seed)
            worlds.append(make_world(dataclasses.replace(cfg.world, seed=seed)))
            encoder = build_encoder(cfg)
            models.append(
                nn.Sequential(encoder, nn.Linear(cfg.rep_dim, cfg.world.n_types))
            )
            gens.append(make_generator(seed + 1))
        layers = [_linears(m) for m in models]
        L, S = len(layers[0]), len(seeds)
        W = [torch.stack([ls[i].weight.detach() for ls in layers]) for i in range(L)]
        b = [
            None
            if layers[0][i].bias is None
            else torch.stack([ls[i].bias.detach() for ls in layers])
            for i in range(L)
        ]
        live = [p.clone() for p in W + b if p is not None]
        it = iter(live)
        W = [next(it) for _ in W]
        b = [None if p is None else next(it) for p in b]
        opt = torch.optim.Adam(live, lr=cfg.pretrain_lr)
        losses = torch.empty(S, cfg.pretrain_steps)
        B = cfg.pretrain_batch
        for step in progress(
            range(cfg.pretrain_steps), total=cfg.pretrain_steps, desc="pretraining"
        ):
            batch = sample_worlds(worlds, B, range(cfg.world.n_styles), gens)
            h, types = batch.x, batch.types.unsqueeze(-1)  # (S, B, D), (S, B, 1)
            acts = [h]
            for i in range(L):  # a ReLU after every encoder layer, none after the head
                Wt = W[i].transpose(1, 2)
                h = (
                    torch.bmm(h, Wt)
                    if b[i] is None
                    else torch.baddbmm(b[i][:, None], h, Wt)
                )
                h = h.relu_() if i < L - 1 else h
                acts.append(h)
            # each seed's cross-entropy (its mean over the batch) and its gradient,
            # written out: (softmax - one-hot) / B in the logits, passed back through
            # every layer's weights and ReLU (whose output is >= 0: its sign is the
            # 0/1 mask)
            logp = torch.log_softmax(h, dim=-1)  # (S, B, types)
            losses[:, step] = -logp.gather(-1, types).squeeze(-1).mean(-1)
            d = logp.exp_().scatter_add_(-1, types, torch.full(types.shape, -1.0))
            d.div_(B)
            for i in reversed(range(L)):
                W[i].grad = torch.bmm(d.transpose(1, 2), acts[i])
                if b[i] is not None:
                    b[i].grad = d.sum(1)
                if i > 0:
                    d = torch.bmm(d, W[i]).mul_(torch.sign(acts[i]))
            opt.step()
        norms = torch.zeros(S, dtype=torch.float64)
        with torch.no_grad():
            for k, (seed, model) in enumerate(zip(seeds, models)):
                for i, lin in enumerate(_linears(model)):
                    lin.weight.copy_(W[i][k])
                    if lin.bias is not None:
                        lin.bias.copy_(b[i][k])
                xs = worlds[k].source(4096, make_generator(seed + 2)).x
                norms[k] = model[0](xs).norm(dim=1).mean()
        return {
            "encoders": [m[0].state_dict() for m in models],
            "losses": losses,
            "norms": norms,
        }

    out = cached(key, build, name="ch03_encoders")
    encoders = []
    for state, norm in zip(out["encoders"], out["norms"].tolist()):
        enc = build_encoder(cfg)
        enc.load_state_dict(state)
        if cfg.feature_norm is not None:
            with torch.no_grad():
                last = _linears(enc)[-1]
                scale = cfg.feature_norm / norm
                last.weight.mul_(scale)
                if last.bias is not None:
                    last.bias.mul_(scale)
        enc.eval()
        encoders.append(enc)
    return encoders, out["losses"]


def pretrain_encoder(cfg: LPFTConfig, seed: int) -> tuple[MLP, torch.Tensor]:
    """The encoder of world ``seed`` alone (:func:`pretrain_encoders`) and its
    ``(pretrain_steps,)`` pretraining losses."""
    encoders, losses = pretrain_encoders(cfg, (seed,))
    return encoders[0], losses[0]


def feature_change_at_loss(trace: torch.Tensor, target: float) -> float:
    """The ID feature change of a run when its training loss first falls to ``target``.

    ``trace`` is one run's ``(R, 3)`` record (training loss, ID change, OOD change) from
    :func:`run_lpft_experiment`; if the loss never reaches ``target`` the last record is
    used. Comparing two methods at the same training loss is the comparison of the
    source talk.
    """
    trace = check_tensor("trace", trace, shape=(None, 3), floating=True)
    target = check_float("target", target)
    below = (trace[:, 0] <= target).nonzero()
    i = int(below[0]) if len(below) else trace.shape[0] - 1
    return float(trace[i, 1])


def matched_loss_change_ratio(
    ft_trace: torch.Tensor, lpft_trace: torch.Tensor
) -> float:
    """FT's ID feature change over LP-FT's, at LP-FT's final training loss.

    Both arguments are ``(R, 3)`` records (training loss, ID change, OOD change).
    LP-FT's change is read at its last record; FT's when its training loss first
    reaches LP-FT's final loss (:func:`feature_change_at_loss`).
    """
    ft_trace = check_tensor("ft_trace", ft_trace, shape=(None, 3), floating=True)
    lpft_trace = check_tensor("lpft_trace", lpft_trace, shape=(None, 3), floating=True)
    target, lpft_change = float(lpft_trace[-1, 0]), float(lpft_trace[-1, 1])
    if lpft_change <= 0:
        raise ValueError("lpft_trace must end with a positive ID feature change")
    return feature_change_at_loss(ft_trace, target) / lpft_change


@torch.no_grad()
def _span_residual(before: MLP, after: MLP, render: torch.Tensor):
    """:math:`\\max_{j\\ge1}\\lVert\\Delta B R_j - \\Delta B R_0 (R_0^\\top R_j)
    \\rVert_F / \\lVert\\Delta B R_0\\rVert_F` for the change :math:`\\Delta B` of the
    first layer.

    Fine-tuning on style-0 inputs changes :math:`B` only along their span, the columns
    of :math:`R_0` (the span lemma of Chapter 3), so :math:`\\Delta B = M R_0^\\top` and
    an OOD input :math:`R_j z` sees :math:`\\Delta B R_0 (R_0^\\top R_j) z`: in the
    overlap world :math:`R_0^\\top R_j = \\cos^2(a) I`, so exactly :math:`\\cos^2(a)`
    times the change the ID input :math:`R_0 z` sees, and in a
    :class:`SharedStyleWorld` the full change on the shared directions. The residual
    is 0 up to rounding.
    """
    dB = _linears(after)[0].weight - _linears(before)[0].weight  # (out, D)
    id_part = dB @ render[0]
    worst = max(
        float((dB @ r - id_part @ (render[0].T @ r)).norm()) for r in render[1:]
    )
    return worst / max(float(id_part.norm()), 1e-30)


def _hits(logits, labels):
    return float((logits.argmax(1) == labels).double().mean())


def _lpft_results(cfg: LPFTConfig) -> dict:
    """The computation behind :func:`run_lpft_experiment`, neither cached nor read
    from the stored results (the script that stores them calls it)."""
    S, C, alpha = len(cfg.seeds), cfg.world.n_classes, cfg.label_smoothing
    grids = {"lp": cfg.l2s, "ft": cfg.lrs, "lpft": cfg.lrs}
    grids["scratch"] = cfg.scratch_lrs
    f64 = torch.float64
    acc = {m: torch.zeros(S, 2, dtype=f64) for m in METHODS}
    chosen = {m: torch.zeros(S, dtype=f64) for m in METHODS}
    chosen_index = {m: torch.zeros(S, dtype=torch.long) for m in METHODS}
    sweep = {m: torch.zeros(S, len(grids[m]), 3, dtype=f64) for m in METHODS}
    G, R = len(cfg.lrs), cfg.ft_steps // cfg.track_every + 1
    R += cfg.ft_steps % cfg.track_every != 0
    change = {m: torch.full((S, G, 2), math.nan, dtype=f64) for m in FINE_TUNED}
    ood_max = {m: torch.full((S, G), math.nan, dtype=f64) for m in FINE_TUNED}
    span = {m: torch.full((S, G), math.nan, dtype=f64) for m in FINE_TUNED}
    trace = {m: torch.full((S, G, R, 3), math.nan, dtype=f64) for m in FINE_TUNED}
    H = cfg.ft_heads
    head_rows = {
        m: torch.full((S, H if m == "ft" else 1, G, 3), math.nan, dtype=f64)
        for m in FINE_TUNED
    }
    lp_loss, norm_id = torch.zeros(S, dtype=f64), torch.zeros(S, dtype=f64)
    lp_train_acc = torch.zeros(S, dtype=f64)
    overlap = make_world(cfg.world).overlap()

    # every world's encoder, pretrained together, and its data
    encoders, pre_losses = pretrain_encoders(cfg, cfg.seeds)
    data, renders = [], []
    for seed in cfg.seeds:
        world = make_world(dataclasses.replace(cfg.world, seed=seed))
        renders.append(world.render.float())
        g = make_generator(10_000 + seed)
        data.append(
            [
                world.in_distribution(cfg.n_train, g),
                world.in_distribution(cfg.n_val, g),
                world.in_distribution(cfg.n_test, g),
                world.out_of_distribution(cfg.n_test, g),
            ]
        )

    def choose(m, si, rows, order):
        for j, r in enumerate(rows):
            sweep[m][si, j] = torch.tensor(r, dtype=f64)
        scores = [r[0] for r in rows]
        best = select_by_validation(scores, order, tolerance=_tolerance(cfg, scores))
        acc[m][si] = sweep[m][si, best, 1:]
        chosen[m][si] = float(grids[m][best])
        chosen_index[m][si] = best
        return best

    @torch.no_grad()
    def evaluate(enc, head, si, phi=None):  # val, ID, OOD accuracy; features
        samples = data[si][1:]
        phi = phi or [enc(s.x) for s in samples]
        row = [_hits(head(f), s.labels) for f, s in zip(phi, samples)]
        return row, phi[1], phi[2]

    # LP: exact regularised logistic regression on frozen features, solved from
    # the strongest regularisation down (each solve warm-starts the next)
    lp_heads, before = [], []
    for si in progress(range(S), total=S, desc="linear probes"):
        train_s, encoder = data[si][0], encoders[si]
        with torch.no_grad():
            feats = encoder(train_s.x)
            phi = [encoder(s.x) for s in data[si][1:]]
        before.append(phi[1:])
        norm_id[si] = phi[1].norm(dim=1).mean()
        heads, rows, init = [None] * len(cfg.l2s), [None] * len(cfg.l2s), None
        for j in reversed(range(len(cfg.l2s))):
            W, b = softmax_regression(
                feats,
                train_s.labels,
                C,
                l2=cfg.l2s[j],
                label_smoothing=alpha,
                init=init,
            )
            init, heads[j] = (W, b), linear_head(W, b)
            rows[j] = evaluate(encoder, heads[j], si, phi)[0]
        best = choose("lp", si, rows, _conservative_order("lp", len(cfg.l2s)))
        lp_heads.append(heads[best])
        with torch.no_grad():
            lp_loss[si] = F.cross_entropy(
                heads[best](feats), train_s.labels, label_smoothing=alpha
            )
            lp_train_acc[si] = _hits(heads[best](feats), train_s.labels)

    trace_steps = None
    for si, seed in enumerate(progress(cfg.seeds, total=S, desc="fine-tuning")):
        train_s, encoder = data[si][0], encoders[si]
        # FT and LP-FT: the same fine-tuning, from random heads or the LP head, at
        # every learning rate (all (H + 1) G runs trained together)
        heads = [
            random_head(cfg.rep_dim, C, make_generator(1_000_000 * h + 20_000 + seed))
            for h in range(H)
        ]
        plan = [(h, j) for h in range(H) for j in searched(cfg, "ft")]  # FT runs
        runs = fine_tune_batch(
            encoder,
            [heads[h] for h, _ in plan] + [lp_heads[si]] * G,
            train_s.x,
            train_s.labels,
            lrs=[cfg.lrs[j] for _, j in plan] + list(cfg.lrs),
            steps=cfg.ft_steps,
            momentum=cfg.momentum,
            label_smoothing=alpha,
            track={n: data[si][i].x[: cfg.n_track] for n, i in (("id", 2), ("ood", 3))},
            track_every=cfg.track_every,
        )
        trace_steps = runs.trace_steps
        # each run's features of the validation, ID and OOD test inputs, through
        # the span of the training inputs (B0 x and Q^T x computed once)
        Q = _row_space(train_s.x)
        with torch.no_grad():
            shared = [
                (encoder.net[0](s.x), s.x @ Q)
                for s in (data[si][1:] if Q is not None else [])
            ]

        def features_of(enc):
            if Q is None:
                with torch.no_grad():
                    return [enc(s.x) for s in data[si][1:]]
            return _span_features(encoder.net[0], Q, shared, enc)

        where = {
            "ft": {hj: r for r, hj in enumerate(plan)},
            "lpft": {(0, j): len(plan) + j for j in range(G)},
        }
        for m in FINE_TUNED:
            n_heads = H if m == "ft" else 1
            moved = torch.full((n_heads, G, 2), math.nan, dtype=f64)
            worst = torch.full((n_heads, G), math.nan, dtype=f64)
            resid = torch.full((n_heads, G), math.nan, dtype=f64)
            for (h, j), r in where[m].items():
                if bool(runs.diverged[r]):
                    continue
                enc_r = runs.encoders[r]
                row, phi_id, phi_ood = evaluate(
                    enc_r, runs.heads[r], si, features_of(enc_r)
                )
                head_rows[m][si, h, j] = torch.tensor(row, dtype=f64)
                d_id = (phi_id - before[si][0]).norm(dim=1)
                d_ood = (phi_ood - before[si][1]).norm(dim=1)
                moved[h, j] = torch.stack([d_id.mean(), d_ood.mean()])
                worst[h, j] = d_ood.max()
                resid[h, j] = _span_residual(encoder, enc_r, renders[si])
                if h == 0:  # the trace of the first head's run
                    trace[m][si, j] = torch.stack(
                        [runs.trace[k][r] for k in ("train_loss", "id", "ood")],
                        1,
                    )
            # over the heads: the mean accuracies and change, the largest OOD change
            # and span residual; a rate where a run diverged (or FT did not run) is
            # NaN, and never chosen
            change[m][si], ood_max[m][si] = moved.mean(0), worst.amax(0)
            span[m][si] = resid.amax(0)
            choose(m, si, head_rows[m][si].mean(0).tolist(), list(range(G)))

        # scratch: the same encoder from PyTorch's default initialisation and a
        # random head, trained like FT on the same ID examples
        seed_everything(30_000 + seed)
        scratch = fine_tune_batch(
            build_encoder(cfg),
            [random_head(cfg.rep_dim, C, make_generator(50_000 + seed))]
            * len(cfg.scratch_lrs),
            train_s.x,
            train_s.labels,
            lrs=list(cfg.scratch_lrs),
            steps=cfg.scratch_steps,
            momentum=cfg.momentum,
            label_smoothing=alpha,
        )
        rows = []
        for r in range(len(cfg.scratch_lrs)):
            if bool(scratch.diverged[r]):
                rows.append([math.nan] * 3)
            else:
                rows.append(evaluate(scratch.encoders[r], scratch.heads[r], si)[0])
        choose("scratch", si, rows, list(range(len(cfg.scratch_lrs))))
    return {
        "acc": acc,
        "chosen": chosen,
        "chosen_index": chosen_index,
        "sweep": sweep,
        "change": change,
        "ood_change_max": ood_max,
        "trace": trace,
        "trace_steps": trace_steps,
        "lp_train_loss": lp_loss,
        "lp_train_acc": lp_train_acc,
        "pretrain_loss": pre_losses[:, -50:].mean(1).double(),
        "feature_norm_id": norm_id,
        "span_residual": span,
        "overlap": overlap,
        "ft_heads": head_rows["ft"],
    }


def run_lpft_experiment(cfg: LPFTConfig) -> dict:
    """LP, FT, LP-FT and the scratch baseline on every seed's world; cached on disk.

    For every seed: pretrain the encoder (:func:`pretrain_encoder`), draw ``n_train``
    labelled ID examples, ``n_val`` ID validation examples and ``n_test`` ID and OOD
    test examples; run LP at every ``l2``, FT and LP-FT at every learning rate and the
    scratch baseline at every ``scratch_lrs`` value; choose each method's value by
    :func:`select_by_validation` with a tolerance of ``select_se`` standard errors of
    the best validation accuracy. LP-FT starts from the chosen LP head.
    Returns a dict of tensors (``S`` seeds, ``G`` grid values, ``R`` records):

    * ``acc[m]``: ``(S, 2)`` ID and OOD test accuracy at the chosen value (for FT the
      mean over its ``H = ft_heads`` random heads);
    * ``chosen[m]``, ``chosen_index[m]``: ``(S,)`` the chosen value and its grid index;
    * ``sweep[m]``: ``(S, G, 3)`` validation, ID and OOD accuracy at every grid value;
    * ``ft_heads``: ``(S, H, G, 3)`` FT's validation, ID and OOD accuracy from each
      random head;
    * ``change[m]`` (FT, LP-FT): ``(S, G, 2)`` average ID and OOD feature change over
      the ``n_test`` test inputs (for FT, averaged over the heads), and
      ``ood_change_max[m]``: ``(S, G)`` the largest change of any OOD test input;
    * ``span_residual[m]`` (FT, LP-FT): ``(S, G)`` how far the change of the first
      layer departs from reaching OOD inputs through the overlap alone
      (:func:`_span_residual`, the largest over FT's heads; 0 up to rounding, by the
      span lemma of Chapter 3);
    * ``trace[m]`` (FT, LP-FT): ``(S, G, R, 3)`` training loss, ID and OOD feature
      change (on ``n_track`` test inputs) at the steps ``trace_steps`` (NaN after a
      divergence), for FT of its first head's runs;
    * ``lp_train_loss``, ``lp_train_acc``: ``(S,)`` the chosen probe's training loss
      and training accuracy (below 1: the ID data are not separable on the frozen
      features), ``pretrain_loss``:
      ``(S,)`` the mean of the last 50 pretraining mini-batch losses,
      ``feature_norm_id``: ``(S,)`` the average feature norm of the ID test inputs, and
      ``overlap``: the world's :math:`\\cos^2(a)` (:meth:`StyleShiftWorld.overlap`).
    """
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")

    # page 03's runs at seed offset 0 are stored with the book
    # (:mod:`fmlab.chapters.ch3_stored`); any other config or offset is computed
    from .ch3_stored import stored_result

    kept = stored_result(cfg)
    if kept is not None:
        return kept
    return cached(cfg, lambda: _lpft_results(cfg), name="ch03_lpft")


def overlap_sweep(
    cfg: LPFTConfig,
    angles: Sequence[float],
    seeds: Sequence[int],
    known: dict | None = None,
) -> dict:
    """:func:`run_lpft_experiment` at every overlap angle (degrees) of ``angles`` with
    the seeds ``seeds``, plus the results of ``known`` (angle -> result, kept as they
    are). Returns ``{angle: result}``, angles in increasing order."""
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    out = dict(known or {})
    for a in angles:
        a = check_float("angles", a, minimum=0.0, maximum=90.0)
        if a not in out:
            out[a] = run_lpft_experiment(at_angle(cfg, a, seeds=tuple(seeds)))
    return {a: out[a] for a in sorted(out)}


#: The talk's two OOD orderings as the overlap sweep tests them: (name, the method
#: expected ahead, the other, the lead it must clear in accuracy points).
ORDERINGS = (
    ("LP − FT", "lp", "ft", 0.0),
    ("LP-FT − LP", "lpft", "lp", 0.0),
    ("LP-FT − LP ≥ 1", "lpft", "lp", 1.0),
)


def clear_orderings(sweep: Mapping[float, dict]) -> dict:
    """Whether each of the :data:`ORDERINGS` is clear at each angle of an overlap
    sweep (:func:`overlap_sweep`): ``{angle: {name: bool}}``. An ordering is clear
    when the paired OOD accuracy difference (points, one sample per seed) clears its
    lead by more than three standard errors and every seed is beyond it
    (:meth:`fmlab.claims.SeedEffect.holds`)."""
    out = {}
    for a, res in sweep.items():
        acc = {m: 100 * res["acc"][m][:, 1] for m in METHODS}
        out[a] = {
            name: SeedEffect.of(acc[ahead] - acc[other]).holds(null=lead)
            for name, ahead, other, lead in ORDERINGS
        }
    return out


def angles_where(holds: Mapping[float, dict], *names: str) -> str:
    """The angles at which every ordering of ``names`` is clear in ``holds`` (from
    :func:`clear_orderings`), as the prose cites them (``"60°, 75°"``), or
    ``"no angle"``."""
    known = {name for name, *_ in ORDERINGS}
    if not names or any(n not in known for n in names):
        raise ValueError(f"names must be among {sorted(known)}, got {names}")
    angles = [a for a, h in holds.items() if all(h[n] for n in names)]
    return ", ".join(f"{a:g}°" for a in angles) or "no angle"


def tolerance_moves(results: Sequence[dict], cfg: LPFTConfig) -> dict:
    """How often the rule's tolerance changed a choice, over the runs of ``results``
    (results of :func:`run_lpft_experiment` with ``cfg``'s grids).

    Returns ``{method: (moved, runs)}``: in ``moved`` of ``runs`` worlds the chosen
    value differs from the one with the single best validation accuracy (exact ties to
    the conservative); and ``"tolerance"``: the mean tolerance used, in accuracy points.
    """
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    out, tols = {}, []
    for m in METHODS:
        moved = runs = 0
        for res in results:
            val = res["sweep"][m][..., 0]
            order = _conservative_order(m, val.shape[1])
            for s in range(val.shape[0]):
                best = select_by_validation(val[s].tolist(), order)
                moved += int(best != int(res["chosen_index"][m][s]))
                runs += 1
                tols.append(100 * _tolerance(cfg, val[s].tolist()))
        out[m] = (moved, runs)
    out["tolerance"] = sum(tols) / len(tols)
    return out


def best_validation(result: dict, method: str) -> torch.Tensor:
    """``method``'s ``(S, 2)`` ID and OOD test accuracy at the grid value with the
    single best validation accuracy (exact ties to the conservative value), beside the
    one-standard-error choice that ``result["acc"][method]`` holds; ``result`` is from
    :func:`run_lpft_experiment`."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    sweep = result["sweep"][method]
    order = _conservative_order(method, sweep.shape[1])
    rows = [
        sweep[s, select_by_validation(sweep[s, :, 0].tolist(), order), 1:]
        for s in range(sweep.shape[0])
    ]
    return torch.stack(rows)


def probe_contrast(results: Sequence[dict], cfg: LPFTConfig, l2s: tuple) -> dict:
    """LP at ``l2s[0]`` minus LP at ``l2s[1]`` (two values of ``cfg.l2s``), in
    accuracy points, over every world of ``results``: ``{"val", "id", "ood"}``, each
    the mean difference of that accuracy, and ``"ahead"``: ``(worlds where l2s[0] has
    the higher validation accuracy, worlds)``."""
    if not isinstance(cfg, LPFTConfig):
        raise TypeError(f"cfg must be a LPFTConfig, got {type(cfg).__name__}")
    if len(l2s) != 2 or any(v not in cfg.l2s for v in l2s):
        raise ValueError(f"l2s must be two values of cfg.l2s {cfg.l2s}, got {l2s}")
    i, j = (cfg.l2s.index(v) for v in l2s)
    diff = torch.cat([r["sweep"]["lp"][:, i] - r["sweep"]["lp"][:, j] for r in results])
    out = {
        k: float(100 * diff[:, c].mean()) for c, k in enumerate(("val", "id", "ood"))
    }
    out["ahead"] = (int((diff[:, 0] > 0).sum()), diff.shape[0])
    return out
