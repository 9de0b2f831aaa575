"""The exact margin gradients of a group of points, each by its route, and the rows they are
pulled on (:mod:`probust.linearisation.routes` chooses the routes).

:class:`Rows` holds the copies of a group of points and pulls cotangents back on them through
one kept forward pass (:class:`probust.linearisation.pullback.Pullback`); :class:`Exact` builds
the cotangents every route needs (a boundary's on the features, the head route's basis vectors
and its check) and runs one pull for them all, and forward mode for the forward route.

Through a linear head W (:mod:`probust.linearisation.head`) the margins' normals are u = A J with
A_i = W_t - W_i and J the features' Jacobian [d, *S], and their variances diag(A M A^T) with
M = J S J^T: :func:`boundary_weights`, :func:`margin_normals`, :func:`boundary_variances`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from probust._user_model import to_format
from probust.linearisation.counting import CANDIDATES, DIRECT, FORWARD, HEAD
from probust.linearisation.margins import margin_jacobian
from probust.linearisation.pullback import JacobianPlan, Pullback, Strategy, features_and_logits, other_classes
from probust.linearisation.screening import Pruned
from probust.mvn import add_rows

if TYPE_CHECKING:
    from probust.linearisation.routes import Context


class Rows:
    """The rows of a group of points (N copies each) and the pullbacks of cotangents on them.

    Where the rows fit one pass, its graph is kept and every pull reuses it; otherwise each
    pull runs the forward passes again, block by block (MMSE with more copies than a pass holds),
    unless the context is differentiable: then every block's graph is kept, as its result needs.
    """

    def __init__(self, ctx: Context, copies: Tensor) -> None:
        self.ctx = ctx
        self.points, self.n = copies.shape[:2]
        self.rows = copies.reshape(self.points * self.n, *copies.shape[2:])
        self.row_point = torch.arange(self.points, device=copies.device).repeat_interleave(self.n)
        # MMSE's copies of a point may outnumber the pull rows, which are sized for the widest
        # pull: where their graph fits, one forward pass serves every pull (no pass per block).
        rows = max(ctx.pull_rows, ctx.graph_rows)
        self.blocks = [slice(i, i + rows) for i in range(0, len(self.rows), rows)]
        self._kept: list[Pullback] = []
        if len(self.blocks) == 1 or ctx.differentiable:
            self._kept = [self._pullback(block) for block in self.blocks]
            self.logits = _cat([kept.logits for kept in self._kept])
            self.features = _cat([kept.features for kept in self._kept])
        else:
            run = features_and_logits(ctx.model, ctx.head)
            outs = []
            with torch.no_grad():
                for block in self.blocks:
                    outs.append(run(to_format(self.rows[block], ctx.plan.channels_last)))
            self.features = torch.cat([f for f, _ in outs])
            self.logits = torch.cat([g for _, g in outs])

    def _pullback(self, block: slice) -> Pullback:
        rows = to_format(self.rows[block], self.ctx.plan.channels_last)
        return Pullback(
            self.ctx.model, rows, self.ctx.head, strategy=self.ctx.pull, differentiable=self.ctx.differentiable
        )

    def pull(self, cotangents: Tensor) -> Tensor:
        """Input gradients [R, K, *S] of cotangents [K, R, F] on the rows' features."""
        if self._kept:
            return _cat(
                [self._pull(pullback, cotangents[:, block]) for pullback, block in zip(self._kept, self.blocks)]
            )
        # One block's graph alive at a time: each pull runs its forward pass again.
        return torch.cat([self._pull(self._pullback(block), cotangents[:, block]) for block in self.blocks])

    def _pull(self, pullback: Pullback, cotangents: Tensor) -> Tensor:
        if self.ctx.every_boundary:
            return pullback.pull(cotangents, chunk_size=self.ctx.plan.class_chunk, pad=False)
        return pullback.pull(cotangents)

    def average(self, per_row: Tensor) -> Tensor:
        """[P, ...]: the mean of [R, ...] over each point's copies."""
        if self.n == 1:
            return per_row
        return add_rows(per_row.new_zeros(self.points, *per_row.shape[1:]), self.row_point, per_row) / self.n


def _cat(parts: list[Tensor]) -> Tensor:
    """The parts concatenated along rows (one part as it is: no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class Exact:
    """The exact margin gradients of a group of points, each by its route.

    One pull serves the direct and candidate routes (their boundaries' cotangents) and the head
    route (basis vectors of the alive features, and one check of the dead ones); the forward
    route runs forward mode on its points' copies.

    Attributes:
        exact: bool [P, C], the boundaries whose exact variance is known (only where the context
            prunes: nothing reads it otherwise, so no variance is computed).
        variance: float64 [P, C], u_i S u_i^T where ``exact``.
    """

    def __init__(
        self,
        ctx: Context,
        rows: Rows,
        c: Tensor,
        target: Tensor,
        route: Tensor,
        screened: Pruned | None,
        alive: Tensor | None,
        copies: Tensor,
    ) -> None:
        points, classes = c.shape
        self.ctx, self.target, self.classes = ctx, target, classes
        self.exact = torch.zeros(points, classes, dtype=torch.bool, device=c.device)
        self.variance = torch.zeros(points, classes, dtype=torch.float64, device=c.device)
        self.list_points = ((route == DIRECT) | (route == CANDIDATES)).nonzero().flatten()
        self.head_points = (route == HEAD).nonzero().flatten()
        self.forward_points = (route == FORWARD).nonzero().flatten()
        self.shape = copies.shape[2:]

        # The listed boundaries of each list-route point: all others, or the screening's candidates.
        listed = target[:, None].expand(-1, 1)
        count = 0
        if len(self.list_points):
            direct = route[self.list_points] == DIRECT
            candidates = screened.classes[self.list_points] if screened is not None else target[self.list_points, None]
            width = classes - 1 if bool(direct.any()) else candidates.shape[1]
            others = other_classes(target[self.list_points], classes)[:, :width]
            listed_here = torch.where(direct[:, None], others, pad_to(candidates, target[self.list_points], width))
            listed = target[:, None].expand(-1, width).clone()
            listed[self.list_points] = listed_here
            count = int((listed_here != target[self.list_points, None]).sum(1).max())
            listed = listed[:, : max(count, 1)]
        self.listed = listed  # [P, L], padded with the target
        # Nothing listed (every candidate screened out): no pull of padding alone.
        list_width = count if len(self.list_points) else 0

        row_route = route[rows.row_point]
        head_rows = row_route == HEAD
        order = count_alive = None
        width = list_width
        if len(self.head_points):
            assert alive is not None
            order = torch.argsort((~alive).to(torch.int8), dim=1, stable=True)  # [R, d], alive first
            count_alive = alive.sum(1)
            width = max(width, int(count_alive[head_rows].max()) + 1)  # + one check of the dead ones

        self.u_listed: Tensor | None = None
        self.jacobian: Tensor | None = None
        if width > 0:
            features = rows.features
            cot = torch.zeros(width, rows.rows.shape[0], features.shape[1], dtype=features.dtype, device=c.device)
            if list_width:
                list_rows = (row_route == DIRECT) | (row_route == CANDIDATES)
                row_cot = _boundary_cotangents(target[rows.row_point], listed[rows.row_point], ctx.head, classes)
                cot[:list_width] = torch.where(list_rows[:, None, None], row_cot, 0.0).transpose(0, 1)
            if alive is not None and order is not None and count_alive is not None:
                cot += _basis_cotangents(features, alive, order, count_alive, head_rows, width)
            grads = rows.pull(cot)  # [R, width, *S]
            if list_width:
                u = rows.average(grads[:, :list_width])[self.list_points]
                self.u_listed = u
                if ctx.prune:
                    var = ctx.noise.quadratic_form(u).diagonal(dim1=1, dim2=2)
                    mark = listed[self.list_points] != target[self.list_points, None]
                    self._record(self.list_points, listed[self.list_points], var, mark)
            if alive is not None and order is not None and count_alive is not None:
                self.jacobian = _head_jacobian(rows, grads, alive, order, count_alive, head_rows)[self.head_points]
            if self.jacobian is not None and ctx.prune:
                form = ctx.noise.quadratic_form(self.jacobian)  # [H, d, d]
                assert ctx.head is not None  # the head route needs one
                var = boundary_variances(boundary_weights(ctx.head, target[self.head_points]), form)
                self.exact[self.head_points] = True
                self.variance[self.head_points] = var
        self.u_forward: Tensor | None = None
        if len(self.forward_points):
            self.u_forward = _forward_normals(ctx, copies[self.forward_points], target[self.forward_points])
            if ctx.prune:
                self.exact[self.forward_points] = True
                self.variance[self.forward_points] = ctx.noise.quadratic_form(self.u_forward).diagonal(dim1=1, dim2=2)

    def _record(self, which: Tensor, classes: Tensor, variance: Tensor, mark: Tensor) -> None:
        exact = self.exact[which]
        var = self.variance[which]
        exact.scatter_(1, classes, mark | exact.gather(1, classes))
        var.scatter_(1, classes, torch.where(mark, variance, var.gather(1, classes)))
        self.exact[which] = exact
        self.variance[which] = var

    def kept_normals(self, kept: Tensor) -> Tensor:
        """u [P, K, *S] of the boundaries ``kept`` [P, K] (each computed exactly; the target: 0)."""
        points, width = kept.shape
        some = (
            self.u_listed
            if self.u_listed is not None
            else self.jacobian
            if self.jacobian is not None
            else self.u_forward
        )
        assert some is not None or bool((kept == self.target[:, None]).all())
        dtype = some.dtype if some is not None else torch.float32
        out = torch.zeros(points, width, *self.shape, dtype=dtype, device=kept.device)
        if self.u_listed is not None:
            listed = self.listed[self.list_points]
            position = torch.zeros(len(self.list_points), self.classes, dtype=torch.int64, device=kept.device)
            position.scatter_(1, listed, torch.arange(listed.shape[1], device=kept.device).expand_as(listed))
            # Every kept class was listed; the padding (the target) gets a zero gradient.
            here = kept[self.list_points]
            u = self.u_listed.gather(1, _expand(position.gather(1, here), self.u_listed))
            padding = here == self.target[self.list_points, None]
            out[self.list_points] = torch.where(_expand(padding, u), 0.0, u)
        if self.jacobian is not None:
            assert self.ctx.head is not None
            a = boundary_weights(self.ctx.head, self.target[self.head_points], kept[self.head_points])
            out[self.head_points] = margin_normals(a, self.jacobian)
        if self.u_forward is not None:
            out[self.forward_points] = self.u_forward.gather(1, _expand(kept[self.forward_points], self.u_forward))
        return out

    def all_normals(self) -> Tensor:
        """u [P, C, *S] of every boundary (0 at the target): the routes without pruning."""
        every = torch.arange(self.classes, device=self.target.device).expand(len(self.target), -1)
        return self.kept_normals(every)


def per_point_max(rows: Rows, per_row: Tensor) -> Tensor:
    out = torch.zeros(rows.points, dtype=per_row.dtype, device=per_row.device)
    return out.scatter_reduce(0, rows.row_point, per_row, reduce="amax", include_self=False)


def pad_to(classes: Tensor, target: Tensor, width: int) -> Tensor:
    """classes [P, K] cut or padded (with each point's target) to [P, width]."""
    if classes.shape[1] >= width:
        return classes[:, :width]
    return torch.cat([classes, target[:, None].expand(-1, width - classes.shape[1])], dim=1)


def _boundary_cotangents(target: Tensor, classes: Tensor, head: nn.Linear | None, count: int) -> Tensor:
    """[R, K, F]: the cotangents on the features of boundaries ``classes`` [R, K] of rows with
    targets [R]: W_t - W_i through a head, e_t - e_i on the logits (0 where i is the target)."""
    if head is not None:
        return boundary_weights(head, target, classes)
    eye = torch.eye(count, device=target.device)
    return eye[target][:, None] - eye[classes]


def _basis_cotangents(
    features: Tensor, alive: Tensor, order: Tensor, count: Tensor, head_rows: Tensor, width: int
) -> Tensor:
    """[width, R, d]: for the head route's rows, e_k for each alive feature k (in ``order``),
    then one random combination of the dead features (its pullback must be exactly 0)."""
    rows, d = features.shape
    cot = torch.zeros(width, rows, d, dtype=features.dtype, device=features.device)
    slots = torch.arange(width, device=features.device)[:, None]
    used = (slots < count[None]) & head_rows[None]  # [width, R]
    index = order.T[: min(width, d)]
    cot[: index.shape[0]].scatter_(2, index[..., None], used[: index.shape[0], :, None].to(features.dtype))
    weights = torch.randn(rows, d, generator=torch.Generator().manual_seed(0), dtype=features.dtype).to(features.device)
    check = torch.where(alive, 0.0, weights) * head_rows[:, None]
    cot[count.clamp_max(width - 1), torch.arange(rows, device=features.device)] += torch.where(
        head_rows[:, None] & (count[:, None] < width), check, 0.0
    )
    return cot


def _head_jacobian(rows: Rows, grads: Tensor, alive: Tensor, order: Tensor, count: Tensor, head_rows: Tensor) -> Tensor:
    """J [P, d, *S] averaged over copies, from the pulled basis rows (zeros for other routes);
    rows whose dead features fail the check get every dead row pulled back as well."""
    n_rows, d = alive.shape
    width = grads.shape[1]
    flat = grads.flatten(2)  # [R, width, D]
    check = flat[torch.arange(n_rows, device=flat.device), count.clamp_max(width - 1)]
    failed = head_rows & ~alive.all(1) & (check != 0).any(1)
    jacobian = flat.new_zeros(n_rows, d, flat.shape[2])
    slots = min(width, d)
    used = (torch.arange(slots, device=flat.device)[None] < count[:, None]) & head_rows[:, None]
    index = order[:, :slots]
    jacobian.scatter_add_(
        1, index[..., None].expand(-1, -1, flat.shape[2]), torch.where(used[..., None], flat[:, :slots], 0.0)
    )
    if bool(failed.any()):
        # A feature at 0 whose Jacobian row is not 0 (e.g. no ReLU before the head): pull every dead row.
        dead = ~alive & failed[:, None]
        dead_count = dead.sum(1)
        dead_order = torch.argsort((~dead).to(torch.int8), dim=1, stable=True)
        extra_width = int(dead_count.max())
        cot = _basis_cotangents(rows.features, ~dead, dead_order, dead_count, failed, extra_width + 1)
        # _basis_cotangents adds a check slot for rows' "dead" (here: the not-failed) features: cleared.
        cot = cot * (torch.arange(extra_width + 1, device=flat.device)[:, None] < dead_count[None])[..., None]
        more = rows.pull(cot).flatten(2)
        used = torch.arange(extra_width + 1, device=flat.device)[None] < dead_count[:, None]
        index = dead_order[:, : extra_width + 1].clamp_max(d - 1)
        jacobian.scatter_add_(
            1, index[..., None].expand(-1, -1, more.shape[2]), torch.where(used[..., None], more, 0.0)
        )
    return rows.average(jacobian).view(rows.points, d, *grads.shape[2:])


def _expand(index: Tensor, like: Tensor) -> Tensor:
    return index.view(*index.shape, *([1] * (like.ndim - 2))).expand(*index.shape, *like.shape[2:])


def _forward_normals(ctx: Context, copies: Tensor, target: Tensor) -> Tensor:
    """Every u [P', C, *S] by forward mode, averaged over each point's copies."""
    points, n = copies.shape[:2]
    rows = copies.reshape(points * n, *copies.shape[2:])
    row_target = target.repeat_interleave(n)
    parts = [
        _forward_block(
            ctx.model,
            ctx.plan,
            rows[first : first + ctx.plan.rows],
            row_target[first : first + ctx.plan.rows],
            differentiable=ctx.differentiable,
        )
        for first in range(0, len(rows), ctx.plan.rows)
    ]
    u = torch.cat(parts)
    return u.view(points, n, *u.shape[1:]).mean(1) if n > 1 else u


def _forward_block(
    model: nn.Module,
    plan: JacobianPlan,
    rows: Tensor,
    target: Tensor | None,
    *,
    fallback: bool = True,
    differentiable: bool = False,
) -> Tensor:
    """u [R, C, *S] of one pass of rows by forward mode (the forward route), in the plan's format
    and tangent chunks; ``target`` None: each row's prediction; ``fallback`` and
    ``differentiable`` as in :func:`probust.margin_jacobian`."""
    return margin_jacobian(
        model,
        to_format(rows, plan.channels_last),
        target,
        strategy=Strategy.FORWARD,
        class_chunk_size=plan.class_chunk,
        fallback=fallback,
        differentiable=differentiable,
    )[2]


def boundary_weights(head: nn.Linear, target: Tensor, classes: Tensor | None = None) -> Tensor:
    """A [B, K, d] = W_t - W_i for the classes i (int64 [B, K]; None: all C, zero at the target).

    Detached: the head path serves estimates without a graph (``differentiable`` goes direct)."""
    weight = head.weight.detach()
    rows = weight[None].expand(len(target), -1, -1) if classes is None else weight[classes]
    return weight[target][:, None] - rows


def margin_normals(weights: Tensor, jacobian: Tensor) -> Tensor:
    """u [B, K, *S] = A J from boundary weights A [B, K, d] and the features' Jacobian J [B, d, *S]."""
    flat = torch.bmm(weights.to(jacobian.dtype), jacobian.flatten(2))
    return flat.view(*flat.shape[:2], *jacobian.shape[2:])


def boundary_variances(weights: Tensor, feature_form: Tensor) -> Tensor:
    """u_i S u_i^T for every boundary, float64 [B, K]: diag(A M A^T), M = J S J^T [B, d, d]."""
    a = weights.to(torch.float64)
    return torch.einsum("bkd,bde,bke->bk", a, feature_form, a)
