"""Deterministic bounds on a normal orthant probability from its one- and two-dimensional marginals.

For Y ~ N(0, R) and the failure events A_i = {Y_i > z_i}, p = P(Y <= z) = 1 - P(union of A_i).
With q_i = Phi(-z_i) and q_ij = P(A_i and A_j) (the bivariate closed form):

- Hunter (1976): P(union) <= sum_i q_i - sum_{(i, j) in T} q_ij for any spanning tree T of the
  events (the heaviest tree gives the best bound);
- Dawson and Sankoff (1967): P(union) >= 2 S1 / (m + 1) - 2 S2 / (m (m + 1)) for every integer
  m >= 1, with S1 = sum_i q_i, S2 = sum_{i < j} q_ij (best at m = floor(2 S2 / S1) + 1); and
  P(union) >= max_i q_i.

The bracket is tight exactly where p is near 1 and few boundaries interact: the regime in which a
randomised QMC run of a few hundred points can miss the failure region in every replicate, so
that the replicates agree and the error estimate is far too small (docs/mvn.md). Only the
:data:`TOP` largest tails enter the pairwise terms, on a fixed width, so that a problem's bounds
do not depend on its batch; the others enter the upper bound on P(union) by their count times the
smallest of the top tails (each is at most that), which keeps both bounds valid.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probust.mvn.bivariate import BVN_ERROR, bvn_cdf
from probust.mvn.numerics import ndtr, tree_sum

__all__ = ["TOP", "orthant_bounds"]

#: Events whose pairwise intersections are computed: the largest tails of each problem.
TOP = 32
_PAIRS = torch.triu_indices(TOP, TOP, 1)


def orthant_bounds(z: Tensor, corr: Tensor, pad: Tensor) -> tuple[Tensor, Tensor]:
    """Lower and upper bounds on P(Y <= z), Y ~ N(0, corr), per problem, without sampling.

    Args:
        z: float64 [G, K] finite standardised upper bounds (any value on padding).
        corr: float64 [G, K, K] correlations.
        pad: bool [G, K], slots that belong to no variable.

    Returns:
        (lower [G], upper [G]), float64, each widened by the bivariate form's rounding allowance.
        Differentiable in z and corr where autograd is on (the tree and m are discrete choices).
    """
    g, k = z.shape
    q = torch.where(pad, 0.0, ndtr(-torch.where(pad, 0.0, z)))
    width = min(TOP, k)
    order = torch.argsort(q.detach(), dim=1, descending=True, stable=True)[:, :width]
    top_q = torch.nn.functional.pad(q.gather(1, order), (0, TOP - width))
    top_z = torch.nn.functional.pad(z.gather(1, order), (0, TOP - width))
    top_r = corr.gather(1, order[:, :, None].expand(-1, -1, k)).gather(2, order[:, None, :].expand(-1, width, -1))
    top_r = torch.nn.functional.pad(top_r, (0, TOP - width, 0, TOP - width))
    i, j = _PAIRS[0].to(z.device), _PAIRS[1].to(z.device)
    real = (top_q[:, i] > 0) & (top_q[:, j] > 0)
    pair_q = torch.zeros(g, len(i), dtype=z.dtype, device=z.device)
    rows, cols = real.nonzero(as_tuple=True)
    if len(rows):
        a, b = i[cols], j[cols]
        both = bvn_cdf(-top_z[rows, a], -top_z[rows, b], top_r[rows, a, b])
        both = torch.minimum(both.clamp_min(0.0), torch.minimum(top_q[rows, a], top_q[rows, b]))
        pair_q = pair_q.index_put((rows, cols), both)
    s1_top = tree_sum(top_q)
    s2_top = tree_sum(pair_q)
    # Dawson-Sankoff on the top events (a union of fewer events is smaller: still a lower bound).
    m = torch.floor(2 * s2_top.detach() / s1_top.detach().clamp_min(1e-300)) + 1
    fail_lower = torch.maximum(2 * s1_top / (m + 1) - 2 * s2_top / (m * (m + 1)), top_q[:, 0])
    # Hunter on the top events, plus every other event at most the smallest top tail.
    tree = _heaviest_tree(pair_q, i, j)
    rest = ((~pad).sum(1) - width).clamp_min(0).to(z.dtype)
    fail_upper = s1_top - tree + rest * top_q[:, width - 1]
    slack = len(i) * BVN_ERROR
    lower = (1 - fail_upper - slack).clamp(0.0, 1.0)
    upper = (1 - fail_lower + slack).clamp(0.0, 1.0)
    return lower, torch.maximum(lower, upper)


def _heaviest_tree(pair_q: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """The weight of a maximum spanning tree over the TOP events (Prim), per problem: [G]."""
    g = pair_q.shape[0]
    weight = pair_q.new_zeros(g, TOP, TOP)
    weight = weight.index_put((torch.arange(g, device=pair_q.device)[:, None], i[None], j[None]), pair_q)
    weight = weight + weight.transpose(1, 2)
    rows = torch.arange(g, device=pair_q.device)
    inside = torch.zeros(g, TOP, dtype=torch.bool, device=pair_q.device)
    inside[:, 0] = True
    best = weight[:, 0]
    edges = []
    for _ in range(TOP - 1):
        pick = torch.where(inside, -1.0, best.detach()).argmax(1)
        edges.append(best[rows, pick])
        inside = inside.clone()
        inside[rows, pick] = True
        best = torch.maximum(best, weight[rows, pick])
    return tree_sum(torch.stack(edges, dim=1))
