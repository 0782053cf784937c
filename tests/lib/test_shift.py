"""Tests of fmlab.data.shift (Chapter 3)."""

import math

import pytest
import torch

from fmlab.data.shift import StyleShiftConfig, StyleShiftWorld


def test_styles_are_orthogonal_and_samples_follow_the_model():
    cfg = StyleShiftConfig()
    w = StyleShiftWorld(cfg)
    R = w.render  # (J, D, p)
    gram = torch.einsum("idp,jdq->ijpq", R, R)
    for i in range(cfg.n_styles):
        for j in range(cfg.n_styles):
            want = (
                torch.eye(cfg.dim_content, dtype=torch.float64)
                if i == j
                else torch.zeros(cfg.dim_content, cfg.dim_content, dtype=torch.float64)
            )
            assert torch.allclose(gram[i, j], want, atol=1e-12)
    s = w.sample(500, (2,), torch.Generator().manual_seed(0))
    # without input noise (the default), an input lies entirely in its style's subspace
    energy = w.style_coordinates(s.x)
    assert torch.allclose(
        energy[:, [0, 1, 3]], torch.zeros(500, 3, dtype=torch.float64), atol=1e-8
    )
    # the label is the rule applied to the content, recovered exactly as R_j^T x
    z = s.x.double() @ R[2]
    assert torch.equal((z @ w.rule.T).argmax(1), s.labels)
    assert bool((s.styles == 2).all())


def test_rendering_matches_the_formula_for_mixed_styles():
    # oracle: x_i = R_{j_i} z_i computed one example at a time
    cfg = StyleShiftConfig(dim_input=12, dim_content=3, n_types=5, input_noise=0.0)
    w = StyleShiftWorld(cfg)
    s = w.source(50, torch.Generator().manual_seed(4))
    for i in range(50):
        R = w.render[int(s.styles[i])]
        z = R.T @ s.x[i].double()  # the content, since R has orthonormal columns
        assert torch.allclose(R @ z, s.x[i].double(), atol=1e-6)
        assert int((z @ w.rule.T).argmax()) == int(s.labels[i])


def test_input_noise_adds_isotropic_noise():
    cfg = StyleShiftConfig(dim_input=12, dim_content=3, input_noise=0.5)
    w = StyleShiftWorld(cfg)
    s = w.sample(20_000, (0,), torch.Generator().manual_seed(5))
    # the energy outside style 0's subspace is pure noise: (D - p) * sigma^2 per input
    outside = w.style_coordinates(s.x)[:, 1:].sum(1)
    want = (cfg.n_styles - 1) * cfg.dim_content * cfg.input_noise**2
    assert float(outside.mean()) == pytest.approx(want, rel=0.03)


def test_splits_use_the_right_styles_and_are_reproducible():
    w = StyleShiftWorld(StyleShiftConfig(n_types=4))
    g = torch.Generator().manual_seed(1)
    assert bool((w.in_distribution(50, g).styles == 0).all())
    ood = w.out_of_distribution(3000, g).styles
    assert set(ood.tolist()) == {1, 2, 3}
    a = w.source(20, torch.Generator().manual_seed(5))
    b = w.source(20, torch.Generator().manual_seed(5))
    assert torch.equal(a.x, b.x) and torch.equal(a.labels, b.labels)
    # the empirical mean content of a type matches its mean: about 5000 draws of type
    # 3, so each coordinate's mean is within 4 standard errors, 0.8 * 4 / 70 < 0.05
    s = w.sample(20_000, (0,), torch.Generator().manual_seed(2))
    z = s.x.double() @ w.render[0]
    m = z[s.types == 3].mean(0)
    assert torch.allclose(m, w.type_means[3], atol=0.05)


def test_invalid_arguments_name_the_argument():
    with pytest.raises(ValueError, match="n_styles"):
        StyleShiftConfig(n_styles=7)
    with pytest.raises(ValueError, match="content_noise"):
        StyleShiftConfig(content_noise=-1.0)
    with pytest.raises(TypeError, match="config"):
        StyleShiftWorld("x")
    w = StyleShiftWorld()
    with pytest.raises(ValueError, match="styles"):
        w.sample(5, (9,), torch.Generator())
    with pytest.raises(TypeError, match="generator"):
        w.sample(5, (0,), 3)


@pytest.mark.parametrize("angle", [0.0, 30.0, 75.0, 90.0])
def test_overlapping_styles_have_the_stated_geometry(angle):
    cfg = StyleShiftConfig(dim_input=20, dim_content=4, n_types=5, overlap_deg=angle)
    w = StyleShiftWorld(cfg)
    c2 = math.cos(math.radians(angle)) ** 2
    eye = torch.eye(4, dtype=torch.float64)
    for i in range(cfg.n_styles):
        for j in range(cfg.n_styles):
            want = eye if i == j else c2 * eye
            assert torch.allclose(w.render[i].T @ w.render[j], want, atol=1e-12)
    assert w.overlap() == pytest.approx(c2)
    # an OOD input's projection on the ID span is cos²(a) times the ID rendering
    g = torch.Generator().manual_seed(0)
    s = w.out_of_distribution(30, g)
    z = torch.linalg.lstsq(
        w.render[s.styles[0]], s.x[0].double().unsqueeze(1)
    ).solution.squeeze(1)
    proj = w.render[0] @ (w.render[0].T @ s.x[0].double())
    assert torch.allclose(proj, c2 * (w.render[0] @ z), atol=1e-5)


def test_overlap_none_is_the_orthogonal_world_and_needs_room():
    a = StyleShiftWorld(StyleShiftConfig(dim_input=20, dim_content=4))
    b = StyleShiftWorld(StyleShiftConfig(dim_input=20, dim_content=4, overlap_deg=None))
    assert torch.equal(a.render, b.render) and a.overlap() == 0.0
    with pytest.raises(ValueError, match="dim_input"):
        StyleShiftConfig(dim_input=16, dim_content=4, overlap_deg=45.0)
    with pytest.raises(ValueError, match="overlap_deg"):
        StyleShiftConfig(dim_input=20, dim_content=4, overlap_deg=120.0)


@pytest.mark.parametrize("input_noise", [0.0, 0.3])
def test_sample_worlds_draws_what_each_world_draws(input_noise):
    # the batched sampler of Chapter 3's pretraining: the same numbers as sample(),
    # world by world, from the same generators
    from fmlab.data.shift import sample_worlds

    cfg = StyleShiftConfig(dim_input=40, dim_content=8, input_noise=input_noise)
    worlds = [
        StyleShiftWorld(
            StyleShiftConfig(**{**cfg.__dict__, "seed": s, "overlap_deg": a})
        )
        for s, a in ((0, None), (3, 60.0), (7, 75.0))
    ]
    for styles in ((0,), (1, 2, 3), range(4)):
        gens = [torch.Generator().manual_seed(10 + i) for i in range(3)]
        twins = [torch.Generator().manual_seed(10 + i) for i in range(3)]
        for _ in range(2):  # and the streams stay in step
            got = sample_worlds(worlds, 64, styles, gens)
            for i, (w, g) in enumerate(zip(worlds, twins)):
                one = w.sample(64, styles, g)
                for field in ("x", "types", "labels", "styles"):
                    assert torch.equal(getattr(got, field)[i], getattr(one, field))
    with pytest.raises(ValueError, match="differ only"):
        other = StyleShiftWorld(StyleShiftConfig(dim_input=40, dim_content=4))
        sample_worlds([worlds[0], other], 4, (0,), gens[:2])
    with pytest.raises(ValueError, match="one entry per world"):
        sample_worlds(worlds, 4, (0,), gens[:2])
