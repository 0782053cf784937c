"""Empirical neural tangent kernels and their relatives (Chapter 4).

For a model :math:`f(x;\\theta)` with trainable parameters :math:`\\theta \\in
\\mathbb{R}^P` and the gradient :math:`g(x) = \\nabla_\\theta f(x;\\theta_0)` at the
pretrained weights,

.. math::
    K^{(\\mathrm{SGD})}(x, x') = \\langle g(x), g(x') \\rangle, \\qquad
    K^{(\\mathrm{A\\text{-}SignGD})}(x, x') = \\langle g(x), \\operatorname{sign} g(x')
    \\rangle, \\qquad K^{(\\mathrm{SignGD})}(x, x') = \\langle \\operatorname{sign}
    g(x), \\operatorname{sign} g(x') \\rangle,

the empirical NTK (Jacot et al., 2018), and the asymmetric and symmetric SignGD kernels
of Malladi et al. (2023). Everything here is computed with ``torch.func``: the
per-example Jacobian is ``vmap(jacrev(f))`` over a batch, taken in chunks so memory
stays bounded; :func:`empirical_ntk_autograd_loop` is the slow, obvious reference (one
backward pass per example and output) that the tests and ``scripts/bench_entk.py``
compare against.

Also here: the linearized model :math:`f(x;\\theta_0) + \\langle g(x), \\theta -
\\theta_0\\rangle` (one ``jvp``), kernel logistic regression (the kernel analog of
training to convergence), the relative distance between two kernels, and the kernel of
LoRA as a random projection of the weight gradients.

Used in Chapter 4 (``notebooks/04-kernel-view.ipynb``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch import nn
from torch.func import functional_call, jacrev, jvp, vmap

from .._validate import check_float, check_int, check_tensor

__all__ = [
    "KERNELS",
    "trainable_params",
    "jacobian",
    "empirical_kernels",
    "kernels_from_jacobians",
    "empirical_ntk",
    "flat_params",
    "empirical_ntk_autograd_loop",
    "linearized_outputs",
    "kernel_distance",
    "newton_minimize",
    "fit_kernel_logistic",
    "kernel_predict",
    "kernel_gradient_descent",
    "lora_projected_kernel",
    "linear_per_example_gradients",
    "time_entk",
]

#: The kernels this module computes, by name: how each side of the inner product is
# mapped.
KERNELS = {
    "sgd": (False, False),  # <g(x), g(x')>
    "asymmetric_signgd": (False, True),  # <g(x), sign g(x')>
    "signgd": (True, True),  # <sign g(x), sign g(x')>
}


def _check_model(model) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return model


def trainable_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that gradients flow to (``requires_grad=True``), detached, by
    name.

    Frozen parameters (``requires_grad=False``, e.g. the pretrained weights under LoRA)
    are held fixed, so every kernel in this module is the kernel *of the trainable
    part*.
    """
    _check_model(model)
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    if not params:
        raise ValueError("model has no trainable parameters (requires_grad=True)")
    return params


def flat_params(model: nn.Module) -> torch.Tensor:
    """The trainable parameters as one vector, in the order :func:`jacobian` uses."""
    return torch.cat([p.reshape(-1) for p in trainable_params(model).values()])


def _frozen_state(model: nn.Module) -> dict[str, torch.Tensor]:
    frozen = {k: v.detach() for k, v in model.named_parameters() if not v.requires_grad}
    frozen.update({k: v for k, v in model.named_buffers()})
    return frozen


def _single_output_fn(model: nn.Module):
    """``f(params, x_i)``: the model on one example, through ``functional_call``."""
    frozen = _frozen_state(model)

    def f(params, xi):
        return functional_call(model, {**params, **frozen}, (xi.unsqueeze(0),)).squeeze(
            0
        )

    return f


def _jacobian_chunks(model: nn.Module, x: torch.Tensor, chunk_size: int):
    """Per-example Jacobians, ``chunk_size`` examples at a time, one block per
    parameter.

    Yields lists of tensors ``(c, size_k)`` or ``(c, m, size_k)``, one per trainable
    parameter in the order of ``model.named_parameters()``. They are views of what
    ``vmap(jacrev(f))`` returns: nothing is copied into one flat matrix, which for a
    100k-parameter model took longer than the backward passes themselves.
    """
    params = trainable_params(model)
    per_example = vmap(jacrev(_single_output_fn(model)), in_dims=(None, 0))
    for start in range(0, x.shape[0], chunk_size):
        jac = per_example(
            params, x[start : start + chunk_size]
        )  # name -> (c, *out, *param)
        blocks = []
        for name, value in jac.items():
            out_shape = value.shape[: value.ndim - params[name].ndim]  # (c,) or (c, m)
            if len(out_shape) > 2:
                raise ValueError(
                    "model must return (n,) or (n, m) outputs, got per-example shape "
                    f"{tuple(out_shape[1:])}"
                )
            blocks.append(value.reshape(*out_shape, -1))
        yield blocks


def jacobian(
    model: nn.Module, x: torch.Tensor, *, chunk_size: int = 64
) -> torch.Tensor:
    """Per-example gradients of the outputs with respect to the trainable parameters.

    Parameters
    ----------
    model : nn.Module
        ``model(x)`` returns ``(n,)`` (one output per example) or ``(n, m)``.
    x : Tensor
        A batch of inputs, first axis = examples.
    chunk_size : int
        Examples per ``vmap`` call; memory grows with ``chunk_size * P``.

    Returns
    -------
    Tensor ``(n, P)`` for scalar outputs or ``(n, m, P)``, parameters flattened in the
    order of ``model.named_parameters()``.
    """
    _check_model(model)
    x = check_tensor("x", x, finite=False)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    if x.shape[0] == 0:
        raise ValueError("x must hold at least one example")
    return torch.cat(
        [
            torch.cat(blocks, dim=-1)
            for blocks in _jacobian_chunks(model, x, chunk_size)
        ],
        dim=0,
    )


def _as_rows(jac: torch.Tensor) -> torch.Tensor:
    """``(n, P) -> (n, P)`` and ``(n, m, P) -> (n * m, P)``."""
    return jac.reshape(-1, jac.shape[-1])


def _reshape_kernel(k: torch.Tensor, n1: int, n2: int, m: int | None) -> torch.Tensor:
    if m is None:
        return k
    return k.reshape(n1, m, n2, m).permute(0, 2, 1, 3)  # (n1, n2, m, m)


def _sided(
    blocks: list[torch.Tensor], kernels: list[str]
) -> dict[bool, list[torch.Tensor] | None]:
    """Rows of each Jacobian block (key ``False``) and, if some kernel needs them, their
    signs (key ``True``), indexed as the sign flags of :data:`KERNELS`."""
    rows = [_as_rows(b) for b in blocks]
    need_sign = any(any(KERNELS[name]) for name in kernels)
    return {False: rows, True: [r.sign() for r in rows] if need_sign else None}


def _kernel_block(
    left: dict, right: dict, kernels: list[str]
) -> dict[str, torch.Tensor]:
    """Sum over parameters of the row Gram products: one block of every requested
    kernel."""
    out = {}
    for name in kernels:
        left_sign, right_sign = KERNELS[name]
        pairs = zip(left[left_sign], right[right_sign])
        first_l, first_r = next(pairs)
        k = first_l @ first_r.T
        for a, b in pairs:
            k.addmm_(a, b.T)
        out[name] = k
    return out


def empirical_kernels(
    model: nn.Module,
    x1: torch.Tensor,
    x2: torch.Tensor | None = None,
    *,
    kernels: Iterable[str] = ("sgd",),
    chunk_size: int = 64,
) -> dict[str, torch.Tensor]:
    """Several gradient kernels between ``x1`` and ``x2`` from one pass of Jacobians.

    Parameters
    ----------
    model : nn.Module
        Outputs ``(n,)`` or ``(n, m)``.
    x1, x2 : Tensor
        Inputs; ``x2=None`` means ``x2 = x1`` (its Jacobian is computed once).
    kernels : iterable of str
        Names from :data:`KERNELS`: ``"sgd"``, ``"asymmetric_signgd"``, ``"signgd"``.
    chunk_size : int
        The Jacobian of ``x2`` is kept (``n2 * P`` numbers); that of ``x1`` is formed
        ``chunk_size`` examples at a time.

    Returns
    -------
    dict name -> Tensor ``(n1, n2)`` (scalar outputs) or ``(n1, n2, m, m)``, float32.

    The kernel is accumulated block by block and parameter by parameter, :math:`K =
    \\sum_k J_k J_k^\\top`, so the per-example Jacobian is never copied into one ``(n,
    P)`` matrix.
    """
    _check_model(model)
    kernels = _check_kernel_names(kernels)
    x1 = check_tensor("x1", x1, finite=False)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    if x1.shape[0] == 0:
        raise ValueError("x1 must hold at least one example")
    if x2 is not None:
        x2 = check_tensor("x2", x2, finite=False)
        if x2.shape[1:] != x1.shape[1:]:
            raise ValueError(
                "x1 and x2 must have the same example shape, got "
                f"{tuple(x1.shape)} and {tuple(x2.shape)}"
            )
        if x2.shape[0] == 0:
            raise ValueError("x2 must hold at least one example")
    right_blocks = list(_jacobian_chunks(model, x1 if x2 is None else x2, chunk_size))
    m = right_blocks[0][0].shape[1] if right_blocks[0][0].ndim == 3 else None
    right = [_sided(blocks, kernels) for blocks in right_blocks]
    left = (
        right
        if x2 is None
        else (
            _sided(blocks, kernels)
            for blocks in _jacobian_chunks(model, x1, chunk_size)
        )
    )
    rows = []
    for chunk in left:
        cols = [_kernel_block(chunk, r, kernels) for r in right]
        rows.append(
            {name: torch.cat([c[name] for c in cols], dim=1) for name in kernels}
        )
    n1, n2 = x1.shape[0], (x1 if x2 is None else x2).shape[0]
    return {
        name: _reshape_kernel(torch.cat([r[name] for r in rows]), n1, n2, m)
        for name in kernels
    }


def _check_kernel_names(kernels) -> list[str]:
    kernels = [kernels] if isinstance(kernels, str) else list(kernels)
    if not kernels:
        raise ValueError("kernels must name at least one kernel")
    for name in kernels:
        if name not in KERNELS:
            raise ValueError(f"kernels must be among {list(KERNELS)}, got {name!r}")
    return kernels


def kernels_from_jacobians(
    j1: torch.Tensor, j2: torch.Tensor, *, kernels: Iterable[str] = ("sgd",)
) -> dict[str, torch.Tensor]:
    """Gradient kernels from Jacobians already computed (e.g. a test set's, reused).

    ``j1`` is ``(n1, P)`` or ``(n1, m, P)`` and ``j2`` likewise; returns name -> ``(n1,
    n2)`` or ``(n1, n2, m, m)``, as :func:`empirical_kernels`.
    """
    kernels = _check_kernel_names(kernels)
    j1 = check_tensor("j1", j1, floating=True, finite=False)
    j2 = check_tensor("j2", j2, floating=True, finite=False)
    if j1.ndim not in (2, 3) or j1.ndim != j2.ndim or j1.shape[1:] != j2.shape[1:]:
        raise ValueError(
            "j1 and j2 must both be (n, P) or (n, m, P) with equal trailing sizes, "
            f"got {tuple(j1.shape)} and {tuple(j2.shape)}"
        )
    m = j1.shape[1] if j1.ndim == 3 else None
    blocks = _kernel_block(_sided([j1], kernels), _sided([j2], kernels), kernels)
    return {
        name: _reshape_kernel(k, j1.shape[0], j2.shape[0], m)
        for name, k in blocks.items()
    }


def empirical_ntk(
    model: nn.Module,
    x1: torch.Tensor,
    x2: torch.Tensor | None = None,
    *,
    kernel: str = "sgd",
    chunk_size: int = 64,
) -> torch.Tensor:
    """One gradient kernel (default: the eNTK :math:`\\langle g(x), g(x')\\rangle`); see
    :func:`empirical_kernels`."""
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a string, got {type(kernel).__name__}")
    return empirical_kernels(model, x1, x2, kernels=(kernel,), chunk_size=chunk_size)[
        kernel
    ]


def empirical_ntk_autograd_loop(
    model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None
) -> torch.Tensor:
    """The eNTK the slow way: one forward and one backward pass per example and output.

    The reference implementation for tests and for ``scripts/bench_entk.py``; returns
    the same matrix as ``empirical_ntk(model, x1, x2)``.
    """
    _check_model(model)
    x1 = check_tensor("x1", x1, finite=False)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters (requires_grad=True)")

    def rows(x):
        grads, m = [], None
        for i in range(x.shape[0]):
            out = model(x[i : i + 1]).reshape(-1)
            m = out.numel()
            for j in range(m):
                g = torch.autograd.grad(
                    out[j], params, retain_graph=j + 1 < m, allow_unused=True
                )
                grads.append(
                    torch.cat(
                        [
                            (gi if gi is not None else torch.zeros_like(p)).reshape(-1)
                            for gi, p in zip(g, params)
                        ]
                    )
                )
        return torch.stack(grads), m

    r1, m = rows(x1)
    r2, _ = (r1, m) if x2 is None else rows(check_tensor("x2", x2, finite=False))
    k = r1 @ r2.T
    n1, n2 = r1.shape[0] // m, r2.shape[0] // m
    probe = model(x1[:1])
    return _reshape_kernel(k, n1, n2, None if probe.ndim == 1 else m)


def linearized_outputs(
    model0: nn.Module, model1: nn.Module, x: torch.Tensor
) -> torch.Tensor:
    """The first-order Taylor model at :math:`\\theta_0` evaluated at :math:`\\theta_1`:

    .. math:: f_{\\text{lin}}(x) = f(x;\\theta_0) + \\langle \\nabla_\\theta
    f(x;\\theta_0), \\theta_1 - \\theta_0\\rangle,

    computed with one forward-mode ``jvp`` (no Jacobian is formed). ``model0`` and
    ``model1`` are the same architecture with the same trainable parameters.
    """
    _check_model(model0)
    _check_model(model1)
    x = check_tensor("x", x, finite=False)
    p0, p1 = trainable_params(model0), trainable_params(model1)
    if p0.keys() != p1.keys() or any(p0[k].shape != p1[k].shape for k in p0):
        raise ValueError(
            "model0 and model1 must have the same trainable parameters "
            "(names and shapes)"
        )
    frozen = _frozen_state(model0)
    names = list(p0)

    def f(*values):
        return functional_call(model0, {**dict(zip(names, values)), **frozen}, (x,))

    out, tangent_out = jvp(
        f, tuple(p0[k] for k in names), tuple(p1[k] - p0[k] for k in names)
    )
    return (out + tangent_out).detach()


def kernel_distance(k0: torch.Tensor, k1: torch.Tensor) -> float:
    """Relative change of a kernel, :math:`\\|K_1 - K_0\\|_F / \\|K_0\\|_F`."""
    k0 = check_tensor("k0", k0, floating=True)
    k1 = check_tensor("k1", k1, shape=tuple(k0.shape), floating=True)
    denom = float(k0.double().norm())
    if denom == 0.0:
        raise ValueError("k0 must not be the zero matrix")
    return float((k1.double() - k0.double()).norm()) / denom


def newton_minimize(
    objective,
    newton_step,
    x0: torch.Tensor,
    *,
    max_iter: int,
    tol: float,
) -> torch.Tensor:
    """Damped Newton's method for a smooth convex objective (float64).

    ``newton_step(x)`` returns ``(gradient, step)`` with ``step`` the Newton direction
    :math:`H^{-1}\nabla`; a backtracking (Armijo) line search keeps every iterate
    monotone. Stops after ``max_iter`` steps, when the relative decrease falls below
    ``tol``, or when no step length down to 1e-8 decreases the objective. Shared by
    :func:`fit_kernel_logistic` and
    :func:`fmlab.chapters.ch4_world.fit_logistic_regression`.
    """
    x, value = x0, objective(x0)
    for _ in range(max_iter):
        grad, step = newton_step(x)
        t = 1.0
        while t > 1e-8:
            new = x - t * step
            new_value = objective(new)
            if new_value <= value - 1e-4 * t * float(grad @ step):
                break
            t *= 0.5
        else:
            break
        converged = value - new_value <= tol * max(1.0, abs(value))
        x, value = new, new_value
        if converged:
            break
    return x


def _training_problem(k_train, y, f0, f0_name: str):
    """The checked float64 training kernel ``(n, n)``, labels in {-1, +1} and starting
    outputs (zeros when ``f0`` is None) of a kernel logistic problem."""
    k = check_tensor("k_train", k_train, ndim=2, floating=True).double()
    n = k.shape[0]
    if k.shape[1] != n:
        raise ValueError(f"k_train must be square, got shape {tuple(k.shape)}")
    y = check_tensor("y", y, shape=(n,)).double()
    if not bool(((y == 1) | (y == -1)).all()):
        raise ValueError("y must hold labels in {-1, +1}")
    f0 = (
        torch.zeros(n, dtype=torch.float64)
        if f0 is None
        else check_tensor(f0_name, f0, shape=(n,), floating=True).double()
    )
    return k, y, f0


def fit_kernel_logistic(
    k_train: torch.Tensor,
    y: torch.Tensor,
    *,
    reg: float,
    f0: torch.Tensor | None = None,
    penalty: torch.Tensor | None = None,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> torch.Tensor:
    """Kernel logistic regression: the coefficients :math:`\\alpha` of :math:`f(x) =
    f_0(x) + \\sum_i \\alpha_i K(x, x_i)`.

    Minimises (Newton's method, float64)

    .. math::
        \\frac1n \\sum_i \\log\\bigl(1 + e^{-y_i f(x_i)}\\bigr) + \\frac{\\lambda}{2}
        \\alpha^\\top S \\alpha.

    Read as a linearized model, :math:`f(x) = f_0(x) + \\langle g(x), \\delta\\rangle`
    with the update :math:`\\delta = \\sum_i \\alpha_i u(x_i)` in the span of the
    optimizer's update directions (:math:`u = g` for SGD, :math:`u =
    \\operatorname{sign} g` for SignGD), so :math:`K(x, x_i) = \\langle g(x),
    u(x_i)\\rangle` and the penalty :math:`\\tfrac{\\lambda}{2}\\|\\delta\\|^2` has
    :math:`S_{ij} = \\langle u(x_i), u(x_j)\\rangle` (``penalty``; default ``S = K``,
    right for a symmetric kernel).

    Parameters
    ----------
    k_train : Tensor ``(n, n)``
        :math:`K(x_i, x_j)` on the training set (need not be symmetric).
    y : Tensor ``(n,)``
        Labels in {-1, +1}.
    reg : float
        :math:`\\lambda > 0`.
    f0 : Tensor ``(n,)``, optional
        The pretrained model's outputs on the training set (default 0).
    penalty : Tensor ``(n, n)``, optional
        :math:`S`, symmetric positive semi-definite.
    """
    k, y, f0 = _training_problem(k_train, y, f0, "f0")
    n = k.shape[0]
    reg = check_float("reg", reg, minimum=0.0, strict_min=True)
    s = (
        k
        if penalty is None
        else check_tensor("penalty", penalty, shape=(n, n), floating=True).double()
    )
    max_iter = check_int("max_iter", max_iter, minimum=1)
    alpha = torch.zeros(n, dtype=torch.float64)
    jitter = 1e-12 * float(s.diagonal().abs().mean() + k.abs().max()) + 1e-300

    def objective(a):
        return float(
            torch.nn.functional.softplus(-y * (f0 + k @ a)).mean()
            + 0.5 * reg * a @ s @ a
        )

    def newton_step(a):
        p = torch.sigmoid(-y * (f0 + k @ a))  # -dloss/dmargin
        grad = k.T @ (-y * p) / n + reg * s @ a
        w = p * (1 - p)
        hess = (
            k.T @ (w[:, None] * k) / n
            + reg * s
            + jitter * torch.eye(n, dtype=torch.float64)
        )
        return grad, torch.linalg.lstsq(hess, grad[:, None]).solution[:, 0]

    return newton_minimize(objective, newton_step, alpha, max_iter=max_iter, tol=tol)


def kernel_predict(
    k_test_train: torch.Tensor, alpha: torch.Tensor, f0_test: torch.Tensor | None = None
) -> torch.Tensor:
    """:math:`f(x) = f_0(x) + \\sum_i \\alpha_i K(x, x_i)` for each test input
    (float64)."""
    k = check_tensor("k_test_train", k_test_train, ndim=2, floating=True).double()
    alpha = check_tensor("alpha", alpha, shape=(k.shape[1],), floating=True).double()
    out = k @ alpha
    if f0_test is not None:
        out = (
            out
            + check_tensor(
                "f0_test", f0_test, shape=(k.shape[0],), floating=True
            ).double()
        )
    return out


def kernel_gradient_descent(
    k_train: torch.Tensor,
    k_eval: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    steps: int,
    f0_train: torch.Tensor | None = None,
    f0_eval: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel analog of ``steps`` full-batch gradient steps on the mean logistic
    loss (Definition 3.3 of Malladi et al., 2023): the outputs move in function space,

    .. math::
        f_{t+1}(x) = f_t(x) - \\frac{\\eta}{n} \\sum_i K(x, x_i)\\,\\chi_i^{(t)},
        \\qquad \\chi_i^{(t)} = -y_i\\,\\sigma\\bigl(-y_i f_t(x_i)\\bigr),

    from :math:`f_0`, with the kernel held fixed. A model whose fine-tuning is exactly
    linear in its parameters, trained by gradient descent at rate :math:`\\eta` for
    the same steps, ends at these outputs; no ridge stands in for the stopping time.

    Parameters
    ----------
    k_train : Tensor ``(n, n)``
        :math:`K(x_i, x_j)` on the training set.
    k_eval : Tensor ``(m, n)``
        :math:`K(x, x_j)` for the inputs to predict.
    y : Tensor ``(n,)``
        Labels in {-1, +1}.
    lr, steps
        The step size :math:`\\eta` of the parameter updates and their number.
    f0_train, f0_eval : Tensor, optional
        The starting outputs (default 0).

    Returns
    -------
    Tensor ``(m,)``, float64: the outputs on the evaluated inputs after ``steps``.
    """
    k, y, f_tr = _training_problem(k_train, y, f0_train, "f0_train")
    n = k.shape[0]
    k_ev = check_tensor("k_eval", k_eval, ndim=2, floating=True).double()
    if k_ev.shape[1] != n:
        raise ValueError(
            f"k_eval must have {n} columns (one per training input), got shape "
            f"{tuple(k_ev.shape)}"
        )
    lr = check_float("lr", lr, minimum=0.0, strict_min=True)
    steps = check_int("steps", steps, minimum=0)
    f_ev = (
        torch.zeros(k_ev.shape[0], dtype=torch.float64)
        if f0_eval is None
        else check_tensor(
            "f0_eval", f0_eval, shape=(k_ev.shape[0],), floating=True
        ).double()
    )
    # the outputs at the training inputs decide every step; the evaluated ones follow
    # from the summed coefficients
    coef = torch.zeros(n, dtype=torch.float64)
    for _ in range(steps):
        chi = -y * torch.sigmoid(-y * f_tr)
        f_tr = f_tr - lr / n * (k @ chi)
        coef = coef - lr / n * chi
    if not bool(torch.isfinite(f_tr).all()):
        raise FloatingPointError(
            f"kernel gradient descent diverged (lr = {lr:.3g}); use a smaller lr"
        )
    return f_ev + k_ev @ coef


def lora_projected_kernel(
    grads1: Mapping[str, torch.Tensor],
    grads2: Mapping[str, torch.Tensor],
    projections: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    """The SGD kernel of LoRA at its initialisation, from per-example weight gradients.

    A LoRA layer :math:`W = W_0 + BA` with :math:`B = 0` and a random :math:`A \\in
    \\mathbb{R}^{k \\times d_{in}}` has :math:`\\nabla_B f = (\\nabla_W f) A^\\top` and
    :math:`\\nabla_A f = B^\\top \\nabla_W f = 0`, so its kernel is a random projection
    of the full one:

    .. math:: K_{\\text{LoRA}}(x, x') = \\sum_{\\text{layers}} \\langle G(x) A^\\top,
    G(x') A^\\top\\rangle,
        \\qquad G = \\nabla_W f.

    Parameters
    ----------
    grads1, grads2 : mapping layer -> Tensor ``(n, d_out, d_in)``
        Per-example gradients of each adapted weight matrix.
    projections : mapping layer -> Tensor ``(k, d_in)``
        The matrices :math:`A` (same keys).

    Returns
    -------
    Tensor ``(n1, n2)``.
    """
    if (
        not isinstance(grads1, Mapping)
        or not isinstance(grads2, Mapping)
        or not isinstance(projections, Mapping)
    ):
        raise TypeError(
            "grads1, grads2 and projections must be mappings from layer name to tensor"
        )
    if not (set(grads1) == set(grads2) == set(projections)) or not grads1:
        raise ValueError(
            "grads1, grads2 and projections must have the same, non-empty, set of "
            "layer names"
        )
    total = None
    for name, a in projections.items():
        a = check_tensor(f"projections[{name!r}]", a, ndim=2, floating=True)
        g1 = check_tensor(f"grads1[{name!r}]", grads1[name], ndim=3, floating=True)
        g2 = check_tensor(f"grads2[{name!r}]", grads2[name], ndim=3, floating=True)
        if g1.shape[1:] != g2.shape[1:] or g1.shape[2] != a.shape[1]:
            raise ValueError(
                f"layer {name!r}: gradients {tuple(g1.shape)}, {tuple(g2.shape)} do "
                f"not match projection {tuple(a.shape)}"
            )
        p1 = (g1 @ a.T).reshape(g1.shape[0], -1)
        p2 = (g2 @ a.T).reshape(g2.shape[0], -1)
        term = p1 @ p2.T
        total = term if total is None else total + term
    return total


def linear_per_example_gradients(
    model: nn.Module, x: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-example gradients from **one** batched forward and backward pass.

    The BackPACK / Opacus recipe for models whose trainable parameters all sit in
    ``nn.Linear`` layers: a forward hook keeps each layer's input :math:`a_{it}` and a
    tensor hook its output gradient :math:`\\delta_{it} = \\partial f(x_i) / \\partial
    \\text{out}_{it}` (one backward pass of :math:`\\sum_i f(x_i)` gives them all,
    because the examples do not interact), and an ``einsum`` sums over positions:

    .. math:: \\frac{\\partial f(x_i)}{\\partial W} = \\sum_t \\delta_{it} a_{it}^\\top,
        \\qquad \\frac{\\partial f(x_i)}{\\partial b} = \\sum_t \\delta_{it}.

    Parameters
    ----------
    model : nn.Module
        Returns ``(n,)`` (one scalar per example); examples must not interact in the
        forward pass (no batch norm). Every trainable parameter must be the weight or
        bias of an ``nn.Linear``.
    x : Tensor
        A batch of inputs.

    Returns
    -------
    dict parameter name -> Tensor ``(n, *param.shape)``, in the order of
    ``model.named_parameters()`` (so their flattened concatenation is :func:`jacobian`).
    """
    _check_model(model)
    x = check_tensor("x", x, finite=False)
    names = list(trainable_params(model))
    layers = {}
    for mod_name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            for p_name, p in mod.named_parameters(recurse=False):
                if p.requires_grad:
                    full = f"{mod_name}.{p_name}" if mod_name else p_name
                    layers.setdefault(mod_name, (mod, []))[1].append(full)
    covered = {n for _, (_, ps) in layers.items() for n in ps}
    missing = [n for n in names if n not in covered]
    if missing:
        raise ValueError(
            "every trainable parameter must belong to an nn.Linear; not: "
            + ", ".join(missing[:5])
        )
    saved: dict[str, list] = {}
    calls: dict[str, int] = {}
    handles = []

    def keep(mod_name):
        def hook(module, inputs, output):
            calls[mod_name] = calls.get(mod_name, 0) + 1
            entry = saved.setdefault(mod_name, [inputs[0].detach(), None])
            if output.requires_grad:

                def grad_hook(grad):
                    entry[1] = grad.detach()

                output.register_hook(grad_hook)

        return hook

    for mod_name, (mod, _) in layers.items():
        handles.append(mod.register_forward_hook(keep(mod_name)))
    try:
        with torch.enable_grad():
            out = model(x)
            if out.ndim != 1:
                raise ValueError(
                    f"model must return one output per example, got {tuple(out.shape)}"
                )
            targets = [p for name, p in model.named_parameters() if name in covered]
            torch.autograd.grad(out.sum(), targets)
    finally:
        for h in handles:
            h.remove()
    n = x.shape[0]
    grads = {}
    for mod_name, (mod, p_names) in layers.items():
        if calls.get(mod_name) != 1 or saved[mod_name][1] is None:
            raise ValueError(
                f"layer {mod_name!r} has trainable parameters but was not called as a "
                "module on the way to the output (or was called twice)"
            )
        a, delta = saved[mod_name]
        a = a.reshape(n, -1, a.shape[-1])
        delta = delta.reshape(n, -1, delta.shape[-1])
        for full in p_names:
            if full.endswith("weight"):
                grads[full] = torch.einsum("nto,nti->noi", delta, a)
            else:
                grads[full] = delta.sum(1)
    return {name: grads[name] for name in names}


def time_entk(
    model: nn.Module,
    x: torch.Tensor,
    *,
    chunk_size: int = 64,
    repeats: int = 3,
    clock: str = "process",
) -> dict[str, float]:
    """Time three ways of computing the eNTK :math:`K = JJ^\\top` of ``model`` on ``x``.

    Each way first forms the per-example Jacobian :math:`J` (``n`` rows of ``P``
    numbers), then pays the same Gram product :math:`JJ^\\top` (:math:`n^2P`
    multiply-adds):

    * ``torch_func``: ``vmap(jacrev(f))`` (:func:`jacobian`);
    * ``loop``: one forward and one backward pass per example
      (:func:`empirical_ntk_autograd_loop`'s rows);
    * ``batched``: one batched forward and backward pass with hooks, then an ``einsum``
      per layer (:func:`linear_per_example_gradients`; needs every trainable parameter
      in an ``nn.Linear``, e.g. only the weight matrices of the transformer blocks).

    Every time is the best of ``repeats`` runs, measured on the ``clock``: ``"process"``
    (CPU time of this process, little disturbed by other programs on a shared machine)
    or ``"wall"``. A warm-up call on two examples comes first. Returns seconds per part
    (``jacobian_<way>``, ``gram``), totals (``total_<way>`` = Jacobian + Gram), the
    share of the Gram product in the ``torch_func`` total, the speed-up of
    ``torch_func`` over each other way, and the largest entry-wise difference between
    the three kernels relative to the largest entry (``max_rel_diff``). Used by
    ``scripts/bench_entk.py`` and Chapter 4.
    """
    import time

    _check_model(model)
    x = check_tensor("x", x, finite=False)
    if x.shape[0] < 2:
        raise ValueError("x must hold at least two examples")
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    repeats = check_int("repeats", repeats, minimum=1)
    if clock not in ("process", "wall"):
        raise ValueError(f"clock must be 'process' or 'wall', got {clock!r}")
    tick = time.process_time if clock == "process" else time.perf_counter

    def now():
        if x.is_cuda:  # pragma: no cover (no GPU in the tests)
            torch.cuda.synchronize(x.device)
        return tick()

    params = [p for p in model.parameters() if p.requires_grad]

    def loop_rows(xs):
        rows = []
        for i in range(xs.shape[0]):
            out = model(xs[i : i + 1]).reshape(())
            g = torch.autograd.grad(out, params, allow_unused=True)
            rows.append(
                torch.cat(
                    [
                        (gi if gi is not None else torch.zeros_like(p)).reshape(-1)
                        for gi, p in zip(g, params)
                    ]
                )
            )
        return torch.stack(rows)

    def batched_rows(xs):
        grads = linear_per_example_gradients(model, xs)
        return torch.cat([g.reshape(xs.shape[0], -1) for g in grads.values()], dim=1)

    ways = {
        "torch_func": lambda xs: jacobian(model, xs, chunk_size=chunk_size),
        "loop": loop_rows,
        "batched": batched_rows,
    }
    for fn in ways.values():  # warm-up
        fn(x[:2])
    best = {name: float("inf") for name in ways}
    best["gram"] = float("inf")
    kernels = {}
    for _ in range(repeats):  # interleaved, so that a busy moment hits every way alike
        for name, fn in ways.items():
            start = now()
            rows = fn(x)
            best[name] = min(best[name], now() - start)
            start = now()
            k = rows @ rows.T
            best["gram"] = min(best["gram"], now() - start)
            kernels[name] = k
    ref = kernels["loop"]
    diff = max(float((k - ref).abs().max() / ref.abs().max()) for k in kernels.values())
    out = {"n": int(x.shape[0]), "parameters": sum(p.numel() for p in params)}
    for name in ways:
        out[f"jacobian_{name}"] = best[name]
        out[f"total_{name}"] = best[name] + best["gram"]
    out["gram"] = best["gram"]
    out["gram_share"] = best["gram"] / out["total_torch_func"]
    out["speedup_vs_loop"] = out["total_loop"] / out["total_torch_func"]
    out["speedup_vs_batched"] = out["total_batched"] / out["total_torch_func"]
    out["max_rel_diff"] = diff
    return out
