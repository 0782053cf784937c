"""Flatness: the trace of the Hessian, its estimators, and the Bartlett identity
(Chapter 5).

Used in Chapter 5 (``notebooks/05-implicit-bias.ipynb``) and
``scripts/bench_hessian_trace.py``. A loss is a function ``loss_fn(params)`` of a dict
of tensors (as ``torch.func`` uses them).

* :func:`hessian_trace_exact` sums the diagonal of the Hessian :math:`H = \\nabla^2
  L(\\theta)`
  with one Hessian-vector product per coordinate (exact, :math:`O(P)` HVPs).
* :func:`hutchinson_trace` is Hutchinson's estimator
  :math:`\\operatorname{tr} H = \\mathbb{E}_v[v^\\top H v]` with Rademacher :math:`v`,
  one HVP per probe; its variance per probe is :math:`2\\sum_{i\\ne j} H_{ij}^2`.
* :func:`fisher_trace` is the sampled-label estimator of Liu et al. (2023, appendix
  B.1):
  for a model of :math:`p_\\theta(y \\mid x)` trained with cross-entropy,

  .. math::
      \\nabla^2 L = \\mathbb{E}_x\\Big[
          \\underbrace{\\mathbb{E}_{y\\sim p_\\theta(\\cdot\\mid x)}
          \\nabla \\log p_\\theta(y\\mid x)\\nabla \\log p_\\theta(y\\mid x)^\\top
          }_{\\text{Fisher / Gauss-Newton}}
          + \\sum_y \\big(p_\\theta(y\\mid x) - p^\\star(y\\mid x)\\big)
          \\nabla^2 z_y(x)\\Big],

  where :math:`z` are the logits. The second term vanishes when the model's conditional
  is the true one (the saturation regime), so there :math:`\\operatorname{tr} H =
  \\mathbb{E}_x\\mathbb{E}_{y\\sim p_\\theta}
  \\lVert\\nabla\\log p_\\theta(y\\mid x)\\rVert^2`,
  estimated by drawing labels *from the model*. Away from saturation the two differ by
  the second term; the Fisher trace is always :math:`\\ge 0`, the Hessian trace need not
  be.
* :func:`gradient_covariance` and :func:`bartlett_gap`: the Bartlett identity (Lemma 4.2
  of
  Liu et al.) says that at a global minimiser of a well-specified likelihood the
  covariance of the per-example gradient equals the Hessian.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch.func import grad, jvp, vmap

from .._validate import check_int
from ..repro import make_generator

#: examples per slice of the per-example-gradient maps: ``vmap`` over all examples at
#: once materialises every intermediate for all of them, and on a CPU slices that stay
#: in cache run about three times faster; each example's gradient is computed alone
#: either way, so the results are the same to the last bit
CHUNK = 64

__all__ = [
    "flatten",
    "hvp",
    "hessian_matrix",
    "hessian_trace_exact",
    "hutchinson_trace",
    "TraceEstimate",
    "parameter_blocks",
    "hessian_block_traces_exact",
    "fisher_trace",
    "fisher_trace_exact",
    "gradient_covariance",
    "bartlett_gap",
    "BartlettCheck",
    "bartlett_check",
]

Params = Mapping[str, torch.Tensor]


def _check_params(params) -> dict[str, torch.Tensor]:
    if not isinstance(params, Mapping) or not params:
        raise TypeError("params must be a non-empty dict of tensors (name -> tensor)")
    out = {}
    for k, v in params.items():
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            raise TypeError(f"params[{k!r}] must be a floating-point tensor")
        out[k] = v.detach()
    return out


def _check_loss_fn(loss_fn):
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable: loss_fn(params) -> scalar tensor")


def flatten(tree: Params) -> torch.Tensor:
    """Concatenate the tensors of a dict into one vector (in the dict's order)."""
    return torch.cat([t.reshape(-1) for t in tree.values()])


def _unflatten_like(vec: torch.Tensor, params: Params) -> dict[str, torch.Tensor]:
    out, i = {}, 0
    for k, t in params.items():
        out[k] = vec[i : i + t.numel()].reshape(t.shape)
        i += t.numel()
    return out


def hvp(
    loss_fn: Callable[[Params], torch.Tensor], params: Params, v: Params
) -> dict[str, torch.Tensor]:
    """Hessian-vector product :math:`Hv` by forward-over-reverse differentiation."""
    _check_loss_fn(loss_fn)
    params = _check_params(params)
    return jvp(grad(loss_fn), (params,), (dict(v),))[1]


def hessian_matrix(
    loss_fn: Callable[[Params], torch.Tensor], params: Params
) -> torch.Tensor:
    """The full Hessian as a ``(P, P)`` matrix (for small models and tests)."""
    _check_loss_fn(loss_fn)
    params = _check_params(params)
    flat = flatten(params)
    return torch.autograd.functional.hessian(
        lambda w: loss_fn(_unflatten_like(w, params)), flat
    )


def hessian_trace_exact(
    loss_fn: Callable[[Params], torch.Tensor], params: Params, *, chunk: int = 256
) -> float:
    """:math:`\\operatorname{tr}\\nabla^2 L` exactly: :math:`\\sum_i e_i^\\top H e_i`,
    ``chunk`` HVPs at a time.

    Costs one HVP per parameter, so it is the slow reference that Hutchinson's estimator
    is compared with.
    """
    _check_loss_fn(loss_fn)
    params = _check_params(params)
    chunk = check_int("chunk", chunk, minimum=1)
    P = sum(t.numel() for t in params.values())
    f = lambda v: flatten(hvp(loss_fn, params, _unflatten_like(v, params)))  # noqa: E731
    batched = vmap(f)
    total = 0.0
    for start in range(0, P, chunk):
        idx = torch.arange(start, min(P, start + chunk))
        basis = torch.zeros(len(idx), P, dtype=next(iter(params.values())).dtype)
        basis[torch.arange(len(idx)), idx] = 1.0
        total += float(batched(basis)[torch.arange(len(idx)), idx].sum())
    return total


@dataclass(frozen=True)
class TraceEstimate:
    """A Monte Carlo estimate of a trace: ``value`` ± ``stderr`` from ``n`` draws.

    ``per_group`` and ``per_group_stderr`` hold the estimate of each ensemble member and
    its standard error when groups were asked for. ``per_block`` (when blocks were asked
    for) maps each parameter block's name to its own :class:`TraceEstimate`: the trace
    of the diagonal block :math:`H_{BB}` of the Hessian, from the same draws, so the
    blocks' values add up to ``value``."""

    value: float
    stderr: float
    n: int
    per_group: torch.Tensor | None = None
    per_group_stderr: torch.Tensor | None = None
    per_block: dict | None = None


def parameter_blocks(params: Params, blocks) -> dict[str, tuple[str, ...]]:
    """Check that ``blocks`` partitions the names of ``params``; return it as a dict.

    ``blocks`` is a mapping ``{block name: parameter names}`` or a callable
    ``block_of(parameter name) -> block name``. Every parameter must lie in exactly one
    block (so that the block traces add up to the trace); the order of the blocks is
    the order in which they first appear among the parameters.
    """
    names = list(params)
    if callable(blocks) and not isinstance(blocks, Mapping):
        out: dict[str, list[str]] = {}
        for k in names:
            b = blocks(k)
            if not isinstance(b, str):
                raise TypeError(
                    f"blocks({k!r}) must return a block name (str), got "
                    f"{type(b).__name__}"
                )
            out.setdefault(b, []).append(k)
        return {b: tuple(v) for b, v in out.items()}
    if not isinstance(blocks, Mapping) or not blocks:
        raise TypeError(
            "blocks must be a non-empty dict {block name: parameter names} or a "
            "callable parameter name -> block name"
        )
    seen: dict[str, str] = {}
    out2: dict[str, tuple[str, ...]] = {}
    for b, members in blocks.items():
        if isinstance(members, str):
            raise TypeError(f"blocks[{b!r}] must be a list of names, not a string")
        members = tuple(members)
        for k in members:
            if k not in params:
                raise ValueError(f"blocks[{b!r}] names {k!r}, which is not in params")
            if k in seen:
                raise ValueError(
                    f"blocks: parameter {k!r} is in both {seen[k]!r} and {b!r}"
                )
            seen[k] = b
        out2[b] = members
    missing = [k for k in names if k not in seen]
    if missing:
        raise ValueError(f"blocks: parameters {missing} are in no block")
    return out2


def _estimate(d: torch.Tensor, groups: int | None, blocks) -> TraceEstimate:
    """Summaries of draws ``d`` of shape ``(draws, blocks, groups or 1)``."""
    m = d.shape[0]

    def one(x):  # x: (draws, groups or 1)
        total = x.sum(1)
        return TraceEstimate(
            value=float(total.mean()),
            stderr=float(total.std() / m**0.5),
            n=m,
            per_group=x.mean(0) if groups is not None else None,
            per_group_stderr=x.std(0) / m**0.5 if groups is not None else None,
        )

    whole = one(d.sum(1))
    if blocks is None:
        return whole
    per_block = {b: one(d[:, i]) for i, b in enumerate(blocks)}
    return TraceEstimate(
        whole.value,
        whole.stderr,
        whole.n,
        whole.per_group,
        whole.per_group_stderr,
        per_block,
    )


def _block_sums(tree: Params, groups: int | None, blocks) -> torch.Tensor:
    """``(blocks, groups or 1)``: each block's sum over all axes but the leading one."""
    if blocks is None:
        return _leading_sums(tree, groups)[None]
    return torch.stack(
        [_leading_sums({k: tree[k] for k in ks}, groups) for ks in blocks.values()]
    )


def _leading_sums(tree: Params, groups: int | None) -> torch.Tensor:
    """Sum each tensor over all axes (``groups=None``) or all but the leading one."""
    if groups is None:
        return sum(t.sum() for t in tree.values()).reshape(1)
    return sum(t.reshape(groups, -1).sum(1) for t in tree.values())


def hessian_block_traces_exact(
    loss_fn: Callable[[Params], torch.Tensor],
    params: Params,
    blocks,
    *,
    chunk: int = 256,
) -> dict[str, float]:
    """:math:`\\operatorname{tr} H_{BB}` for every block :math:`B`, exactly (one HVP per
    parameter).

    ``blocks`` as in :func:`parameter_blocks`. The slow reference for the block traces
    that :func:`hutchinson_trace` and :func:`fisher_trace` estimate.
    """
    _check_loss_fn(loss_fn)
    params = _check_params(params)
    blocks = parameter_blocks(params, blocks)
    return {
        b: hessian_trace_exact(
            lambda sub: loss_fn({**params, **sub}),
            {k: params[k] for k in ks},
            chunk=chunk,
        )
        for b, ks in blocks.items()
    }


def hutchinson_trace(
    loss_fn: Callable[[Params], torch.Tensor],
    params: Params,
    *,
    n_probes: int = 64,
    generator: torch.Generator | None = None,
    chunk: int = 16,
    groups: int | None = None,
    blocks=None,
) -> TraceEstimate:
    """Hutchinson's estimator :math:`\\frac1m\\sum_k v_k^\\top H v_k`, Rademacher
    :math:`v_k`.

    ``groups=E`` treats the leading axis of every tensor as an ensemble axis and also
    returns each member's trace (``per_group``; the members' losses must be independent,
    so that the Hessian is block diagonal).

    ``blocks`` (see :func:`parameter_blocks`) also estimates the trace of each diagonal
    block: :math:`v_B^\\top (Hv)_B` has mean :math:`\\operatorname{tr} H_{BB}` because
    the entries of :math:`v` are independent with mean zero, so one HVP per probe serves
    every block; each block's standard error is from the same probes."""
    _check_loss_fn(loss_fn)
    params = _check_params(params)
    n_probes = check_int("n_probes", n_probes, minimum=2)
    chunk = check_int("chunk", chunk, minimum=1)
    if groups is not None:
        groups = check_int("groups", groups, minimum=1)
        for k, t in params.items():
            if t.ndim == 0 or t.shape[0] != groups:
                raise ValueError(
                    f"groups={groups} needs params[{k!r}] to have leading axis {groups}"
                )
    if blocks is not None:
        blocks = parameter_blocks(params, blocks)
    g = generator if generator is not None else make_generator(0)

    def quad(v):
        hv = hvp(loss_fn, params, v)
        return _block_sums({k: v[k] * hv[k] for k in v}, groups, blocks)

    batched = vmap(quad)
    draws = []
    for start in range(0, n_probes, chunk):
        m = min(chunk, n_probes - start)
        v = {
            k: (torch.randint(0, 2, (m, *t.shape), generator=g).to(t.dtype) * 2 - 1)
            for k, t in params.items()
        }
        draws.append(batched(v))
    d = torch.cat(draws)  # (n_probes, blocks, groups or 1)
    return _estimate(d, groups, blocks)


def fisher_trace(
    log_prob_fn: Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor],
    logits_fn: Callable[[Params, torch.Tensor], torch.Tensor],
    params: Params,
    inputs: torch.Tensor,
    *,
    n_labels: int = 1,
    generator: torch.Generator | None = None,
    groups: int | None = None,
    blocks=None,
) -> TraceEstimate:
    """The sampled-label estimator :math:`\\mathbb{E}_x\\mathbb{E}_{y\\sim
    p_\\theta}\\lVert\\nabla_\\theta\\log p_\\theta(y\\mid x)\\rVert^2`.

    Parameters
    ----------
    log_prob_fn : callable
        ``log_prob_fn(params, x, y)`` for ONE example ``x`` (no batch axis) and label(s)
        ``y``: the (summed) log-probability whose gradient is taken.
    logits_fn : callable
        ``logits_fn(params, inputs)`` returns logits for the whole batch, ``(n, ...,
        C)`` (with a leading ensemble axis ``(E, n, ..., C)`` when ``groups=E``); labels
        are drawn from their softmax.
    inputs : tensor
        ``(n, ...)`` examples (the expectation over :math:`x`).
    n_labels : int
        Independent label draws per example.
    groups : int, optional
        Ensemble size: per-member estimates in ``per_group``.
    blocks : dict or callable, optional
        Parameter blocks (see :func:`parameter_blocks`): each block's share
        :math:`\\mathbb{E}\\lVert\\nabla_B\\log p_\\theta\\rVert^2`, the trace of the
        Fisher's diagonal block, in ``per_block``.

    When ``y`` holds several labels for one example (the masked-LM case: one label per
    position), drawn independently given :math:`x`, the squared norm of the summed score
    is still unbiased for the summed traces, because the scores of independent labels
    have mean zero and are uncorrelated."""
    if not callable(log_prob_fn) or not callable(logits_fn):
        raise TypeError("log_prob_fn and logits_fn must be callable")
    params = _check_params(params)
    if not isinstance(inputs, torch.Tensor) or inputs.ndim < 1 or inputs.shape[0] < 2:
        raise ValueError(
            "inputs must be a tensor with at least 2 examples along axis 0"
        )
    n_labels = check_int("n_labels", n_labels, minimum=1)
    if groups is not None:
        groups = check_int("groups", groups, minimum=1)
    if blocks is not None:
        blocks = parameter_blocks(params, blocks)
    g = generator if generator is not None else make_generator(0)
    with torch.no_grad():
        probs = torch.softmax(logits_fn(params, inputs), dim=-1)
    per_example = vmap(
        grad(log_prob_fn),
        in_dims=(None, 0, 0 if groups is None else 1),
        chunk_size=CHUNK,
    )
    n = inputs.shape[0]
    draws = []
    for _ in range(n_labels):
        y = torch.multinomial(
            probs.reshape(-1, probs.shape[-1]), 1, generator=g
        ).reshape(probs.shape[:-1])
        gs = per_example(params, inputs, y)  # each (n, *param.shape)
        sq = {
            k: (
                t.reshape(n, -1).pow(2).sum(1, keepdim=True)
                if groups is None
                else t.reshape(n, groups, -1).pow(2).sum(2)
            )
            for k, t in gs.items()
        }
        keys = [tuple(gs)] if blocks is None else list(blocks.values())
        draws.append(torch.stack([sum(sq[k] for k in ks) for ks in keys], 1))
    d = torch.cat(draws)  # (n * n_labels, blocks, groups or 1)
    return _estimate(d, groups, blocks)


def fisher_trace_exact(
    log_prob_fn: Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor],
    logits_fn: Callable[[Params, torch.Tensor], torch.Tensor],
    params: Params,
    inputs: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> float:
    """:math:`\\sum_x w(x)\\sum_y p_\\theta(y\\mid x)\\lVert\\nabla\\log
    p_\\theta(y\\mid x)\\rVert^2` with every label summed.

    For single-label classifiers with few classes (tests, the Bartlett check):
    ``logits_fn`` returns ``(n, C)`` and ``log_prob_fn(params, x, y)`` takes one example
    and one label. ``weights`` (default uniform) is a distribution over the rows of
    ``inputs``."""
    params = _check_params(params)
    with torch.no_grad():
        probs = torch.softmax(logits_fn(params, inputs), dim=-1)
    n, C = probs.shape
    w = torch.full((n,), 1.0 / n, dtype=probs.dtype) if weights is None else weights
    per = vmap(
        vmap(grad(log_prob_fn), in_dims=(None, None, 0)),
        in_dims=(None, 0, None),
        chunk_size=CHUNK,
    )
    gs = per(params, inputs, torch.arange(C))  # (n, C, ...)
    sq = sum(t.reshape(n, C, -1).pow(2).sum(2) for t in gs.values())
    return float((w[:, None] * probs * sq).sum())


def gradient_covariance(
    loss_example_fn: Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor],
    params: Params,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of the per-example gradient :math:`\\nabla\\ell(\\theta; x,
    y)`.

    ``weights`` is a distribution over the ``(inputs, labels)`` rows (default uniform),
    so an exact population expectation over a finite support can be passed as a weighted
    list. Returns the mean ``(P,)`` and covariance ``(P, P)``."""
    params = _check_params(params)
    n = inputs.shape[0]
    w = (
        torch.full((n,), 1.0 / n, dtype=torch.float64)
        if weights is None
        else weights.double()
    )
    gs = vmap(grad(loss_example_fn), in_dims=(None, 0, 0), chunk_size=CHUNK)(
        params, inputs, labels
    )
    G = torch.cat([t.reshape(n, -1) for t in gs.values()], dim=1).double()
    mean = w @ G
    centred = G - mean
    return mean, centred.T @ (w[:, None] * centred)


def bartlett_gap(covariance: torch.Tensor, hessian: torch.Tensor) -> float:
    """Relative Frobenius distance :math:`\\lVert\\Sigma - H\\rVert_F / \\lVert
    H\\rVert_F`."""
    if covariance.shape != hessian.shape:
        raise ValueError(
            "covariance and hessian must have the same shape, got "
            f"{tuple(covariance.shape)} and {tuple(hessian.shape)}"
        )
    return float(
        (covariance.double() - hessian.double()).norm() / hessian.double().norm()
    )


# ---------------------------------------------------------------------------------
# a small well-specified model for the Bartlett identity
# ---------------------------------------------------------------------------------
def _tanh_logits(p, x):
    return torch.tanh(x @ p["a"].T + p["b"]) @ p["c"].T


def _tanh_log_prob(p, x, y):
    return torch.log_softmax(_tanh_logits(p, x), dim=-1).gather(-1, y.reshape(1))[0]


@dataclass(frozen=True)
class BartlettCheck:
    """The covariance of the per-example gradient and the Hessian of the population
    loss."""

    covariance: torch.Tensor
    hessian: torch.Tensor
    mean_gradient_norm: float
    relative_gap: float


def bartlett_check(
    *,
    shift: float = 0.0,
    seed: int = 0,
    inputs: int = 6,
    hidden: int = 4,
    classes: int = 3,
    dim: int = 3,
) -> BartlettCheck:
    """Lemma 4.2 of Liu et al. (2023) on a tiny well-specified classifier, computed
    exactly.

    A one-hidden-layer tanh network :math:`p_\\theta(y\\mid x)` with random weights
    :math:`\\theta^\\star` *defines* the data: :math:`x` uniform over ``inputs`` fixed
    points, :math:`y \\sim p_{\\theta^\\star}(\\cdot\\mid x)`. At :math:`\\theta =
    \\theta^\\star + \\text{shift}` (every weight moved by ``shift``), the population
    loss's Hessian (autograd) and the covariance of the per-example gradient (every
    :math:`(x, y)` weighted by its probability) are returned in float64, with
    :math:`\\lVert\\mathbb{E}\\nabla\\ell\\rVert` and the relative Frobenius gap.
    ``shift = 0`` is the global minimiser, where they must coincide."""
    g = make_generator(check_int("seed", seed, minimum=0))
    inputs = check_int("inputs", inputs, minimum=1)
    classes = check_int("classes", classes, minimum=2)
    hidden = check_int("hidden", hidden, minimum=1)
    dim = check_int("dim", dim, minimum=1)
    star = {
        "a": torch.randn(hidden, dim, generator=g, dtype=torch.float64),
        "b": torch.randn(hidden, generator=g, dtype=torch.float64),
        "c": torch.randn(classes, hidden, generator=g, dtype=torch.float64),
    }
    X = torch.randn(inputs, dim, generator=g, dtype=torch.float64)
    with torch.no_grad():
        truth = torch.softmax(_tanh_logits(star, X), dim=-1)
    params = {k: v + float(shift) for k, v in star.items()}
    xs = X.repeat_interleave(classes, 0)
    ys = torch.arange(classes).repeat(inputs)
    weights = (truth / inputs).reshape(-1)
    mean, cov = gradient_covariance(
        lambda p, x, y: -_tanh_log_prob(p, x, y), params, xs, ys, weights
    )
    H = hessian_matrix(
        lambda p: -(truth * torch.log_softmax(_tanh_logits(p, X), -1)).sum(1).mean(),
        params,
    )
    return BartlettCheck(cov, H, float(mean.norm()), bartlett_gap(cov, H))
