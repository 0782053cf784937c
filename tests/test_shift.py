"""Tests of fmlab.data.shift (Chapter 3)."""

import pytest
import torch

from fmlab.data.shift import StyleShiftConfig, StyleShiftWorld


def test_styles_are_orthogonal_and_samples_follow_the_model():
    cfg = StyleShiftConfig(input_noise=0.0)
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
    # without input noise, an input lies entirely in its style's subspace
    energy = w.style_coordinates(s.x)
    assert torch.allclose(
        energy[:, [0, 1, 3]], torch.zeros(500, 3, dtype=torch.float64), atol=1e-8
    )
    # the label is the rule applied to the content, recovered exactly as R_j^T x
    z = s.x.double() @ R[2]
    assert torch.equal((z @ w.rule.T).argmax(1), s.labels)
    assert bool((s.styles == 2).all())


def test_splits_use_the_right_styles_and_are_reproducible():
    w = StyleShiftWorld()
    g = torch.Generator().manual_seed(1)
    assert bool((w.in_distribution(50, g).styles == 0).all())
    ood = w.out_of_distribution(3000, g).styles
    assert set(ood.tolist()) == {1, 2, 3}
    a = w.source(20, torch.Generator().manual_seed(5))
    b = w.source(20, torch.Generator().manual_seed(5))
    assert torch.equal(a.x, b.x) and torch.equal(a.labels, b.labels)
    # type means: the empirical mean content of a type matches its mean (content noise 0.6)
    s = w.sample(20_000, (0,), torch.Generator().manual_seed(2))
    z = s.x.double() @ w.render[0]
    m = z[s.types == 3].mean(0)
    assert torch.allclose(m, w.type_means[3], atol=0.1)


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
