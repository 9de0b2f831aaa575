"""Noisy logits of an affine model without its forward passes: C normals per copy instead of D.

A model that is affine in its input (a linear classifier, with or without a normalisation in
front) has f(x + eps) = f(x) + J eps, J = df/dx [C, D]. Under Gaussian noise eps ~ N(0, S) the
logits of a noisy copy are therefore distributed as f(x) + L z with L L^T = J S J^T and
z ~ N(0, I_C), exactly. Monte Carlo, CERTIFY and PREDICT draw z instead of eps (a D = 784 input
and C = 10 classes: 78 times fewer normals, and no forward pass per copy): the same estimator, its
draws taken in the C-dimensional image of the noise. z comes from the point's own stream, so a
point's copies still depend only on (seed, point index, sample index).

Whether a model is affine is decided from its values, so a model saved with ``torch.export`` or
TorchScript is treated as the module it came from:

- a module with a leaf layer that is never affine (:data:`NONLINEAR_LEAVES`: activations,
  max-pooling, attention, layer norms) is not, without a pass;
- along two fixed random directions v the model's second differences
  f(x + 2hv) - 2 f(x + hv) + f(x) vanish (one forward pass of a few rows, far from x);
- the Jacobian J at the first input equals the Jacobian at two far-away inputs, and the model's
  values there are its first-order expansion's.

The probes are fixed (a generator seeded with 0), so the decision is a function of the model and
the inputs. It pays where C is well below D (:data:`MOST_CLASSES_SHARE`); elsewhere, and for
non-Gaussian noise, the copies go through the model as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from probust.noise import Noise, normal_draws

__all__ = ["MOST_CLASSES_SHARE", "NONLINEAR_LEAVES", "AffineLogits", "affine_logits"]

#: Leaf layers that are not affine: a module holding one is not, and is refused without a pass.
NONLINEAR_LEAVES: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Tanh,
    nn.Sigmoid,
    nn.Hardtanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Softplus,
    nn.Softmax,
    nn.LogSoftmax,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.MultiheadAttention,
)
#: Draws are taken in the logits' space only where C <= this share of D (below it the saving is
#: small against the Jacobian's C backward passes).
MOST_CLASSES_SHARE = 0.25
#: Logits drawn per pass (rows x C), where the copies skip the model: 4 MB of float32.
_PASS_ELEMENTS = 1 << 20
#: Rows of the expansion check: the first input, then inputs this many of its own scale away.
_PROBE_SCALE = 4.0
#: Relative disagreement the float32 expansion check allows.
_RTOL = 1e-4


@dataclass(frozen=True)
class AffineLogits:
    """The noisy logits of an affine model: copy j of point b has logits ``clean[b] + factor @ z``
    with z ~ N(0, I_C) drawn from the point's stream.

    Attributes:
        clean: [B, C], f(x), in the model's dtype.
        factor: [C, C], L with L L^T = J S J^T (the logits' noise covariance), in the model's dtype.
    """

    clean: Tensor
    factor: Tensor

    @property
    def rows(self) -> int:
        """Copies per pass by default: a fixed number of logits (not measured: nothing runs the model)."""
        return max(1, _PASS_ELEMENTS // self.clean.shape[1])

    @property
    def row_bytes(self) -> int:
        """Memory a copy holds in a pass: its normals, their product and its logits."""
        return 3 * self.clean.shape[1] * self.clean.element_size()

    def subset(self, rows: Tensor | slice) -> AffineLogits:
        """The same model's noisy logits at the points ``rows`` only."""
        return AffineLogits(clean=self.clean[rows], factor=self.factor)

    def logits(self, points: slice, keys: Tensor, start: int, count: int) -> Tensor:
        """Logits [P * count, C] of copies start..start+count-1 of the points ``points``
        (``keys`` int64 [P], their streams' keys), as :func:`probust.estimators.base.noisy_logits`
        lays them out."""
        classes = self.clean.shape[1]
        z = normal_draws(keys, start, count, classes, dtype=self.factor.dtype)  # [P, count, C]
        # One product per point, of a shape that depends on the pass's count alone.
        noisy = torch.matmul(z, self.factor.T) + self.clean[points, None]
        return noisy.reshape(-1, classes)


def _has_nonlinear_leaf(model: nn.Module) -> bool:
    return any(isinstance(m, NONLINEAR_LEAVES) for m in model.modules())


def _probes(x0: Tensor) -> Tensor:
    """Offsets far from x0 [*S], [2, *S]: a fixed generator, four times the input's scale."""
    gen = torch.Generator().manual_seed(0)
    scale = float(x0.abs().max().clamp(min=1.0)) * _PROBE_SCALE
    return torch.randn(2, *x0.shape, generator=gen).to(x0) * scale


def _straight(model: nn.Module, x0: Tensor) -> bool:
    """Whether the model's second differences along the probe directions vanish (one pass)."""
    offsets = _probes(x0)
    rows = torch.stack([x0 + k * offset / 2 for offset in offsets for k in range(3)])
    with torch.no_grad():
        f = model(rows).view(2, 3, -1)
    second = f[:, 2] - 2 * f[:, 1] + f[:, 0]
    return bool(torch.isfinite(f).all()) and float(second.abs().max()) <= float(f.abs().max()) * _RTOL * 4


def _jacobian(model: nn.Module, x: Tensor) -> Tensor:
    """df/dx at one input x [*S]: [C, D], one backward pass per class."""
    row = x.detach()[None].clone().requires_grad_(True)
    with torch.enable_grad():
        out = model(row)[0]
        rows = [torch.autograd.grad(out[i], row, retain_graph=i + 1 < out.shape[0])[0] for i in range(out.shape[0])]
    return torch.stack(rows).flatten(1)


def _expansion_holds(model: nn.Module, x0: Tensor, jacobian: Tensor) -> bool:
    """Whether f is affine: its Jacobian and its first-order expansion hold at two inputs far from
    x0 [*S] (fixed probes)."""
    offsets = _probes(x0)
    with torch.no_grad():
        f0 = model(x0[None])[0]
        for offset in offsets:
            f = model((x0 + offset)[None])[0]
            expanded = f0 + jacobian @ offset.flatten()
            size = f.abs().max() + f0.abs().max() + (jacobian.abs() @ offset.abs().flatten()).max()
            if not torch.allclose(f, expanded, rtol=0.0, atol=float(size) * _RTOL):
                return False
            if not torch.allclose(
                _jacobian(model, x0 + offset), jacobian, rtol=_RTOL, atol=float(jacobian.abs().max()) * _RTOL
            ):
                return False
    return True


def affine_logits(model: object, noise: Noise, x: Tensor, clean: Callable[[], Tensor]) -> AffineLogits | None:
    """The noisy logits of ``model`` at the points ``x`` [B, *S] without its forward passes, where
    it is affine and the noise Gaussian; None elsewhere (the copies then go through the model).

    Args:
        model: in eval mode, returning logits [B, C].
        noise: the noise added to each copy.
        x: the points.
        clean: gives the model's logits at ``x``, [B, C] (called only where no leaf layer refuses it).
    """
    if not noise.is_gaussian or not isinstance(model, nn.Module) or len(x) == 0:
        return None
    if x.dtype not in (torch.float32, torch.float64) or _has_nonlinear_leaf(model):
        return None
    logits = clean()
    classes, dims = logits.shape[1], x[0].numel()
    if classes > MOST_CLASSES_SHARE * dims or logits.dtype != x.dtype or not _straight(model, x[0]):
        return None
    jacobian = _jacobian(model, x[0])
    if not torch.isfinite(jacobian).all() or not _expansion_holds(model, x[0], jacobian):
        return None
    cov = noise.quadratic_form(jacobian.view(1, classes, *x.shape[1:]))[0]  # float64 [C, C]
    factor, info = torch.linalg.cholesky_ex(cov)
    if int(info) != 0:  # singular (dependent rows of J): a symmetric square root
        values, vectors = torch.linalg.eigh(cov)
        factor = vectors * values.clamp(min=0).sqrt()
    return AffineLogits(clean=logits.detach(), factor=factor.to(logits.dtype))
