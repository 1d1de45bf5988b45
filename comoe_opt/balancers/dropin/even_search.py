"""The drop-in's search for `even` dispatch (vLLM, SGLang `static`: each expert's tokens split
evenly over its replicas), scored on the steps' moments instead of the steps themselves.

A GPU's load under the even split is linear in the experts' loads, so its recency-weighted mean
over the steps and its variance (with every covariance between experts: experts that burst
together should not share a GPU) follow from the experts' means and covariances. The score is a
smooth bound on the expected peak (objective.lse_at, at the best of a few temperatures), which
the steps' accidents move far less than the mean of their peaks; one step is scored by its peak.
A swap changes two GPUs, so its score costs O(1) once the layer's sums are kept.

`descend` is steepest descent. Each pass scores every move of every layer (neighbourhood.py),
applies each layer's best, then up to `extra_moves` more of the pass's improving moves that touch
other experts, each re-scored on the plan as it then is; a layer stops when no move improves it.
The best moves come first, so a search cut short has made the ones worth most. Given the map in
service, a move must also lower the objective, before its price, on each of two halves of the
steps (objective.half_moments): a move that only one half asks for fits that half's accidents,
and the steps after the plan will not ask for it either.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from comoe_opt.balancers.dropin.config import DEFAULT, SearchConfig, Work
from comoe_opt.balancers.dropin.neighbourhood import neighbourhood, scoring_units, slot_pairs, swaps_per_layer
from comoe_opt.balancers.dropin.objective import Moments, Shape, lower, lse_at, moved, step_mean, temperatures
from comoe_opt.balancers.dropin.pair_cache import PairCovariances
from comoe_opt.balancers.dropin.search import Candidates, Search, columns, one_each, picked


class EvenSearch(Search):
    """Every layer's plan with its GPUs' load means `mu` and variances `var_g`, and each expert's
    covariance with each GPU's load `cov`, kept exact (float64) move by move."""

    def __init__(
        self,
        slots: np.ndarray,
        moments: Moments,
        shape: Shape,
        prev: np.ndarray | None,
        move_cost: float,
        *,
        config: SearchConfig = DEFAULT,
        work: Work | None = None,
        halves: tuple[Moments, Moments] | None = None,
        hold_pairs: bool = True,
    ):
        super().__init__(slots, moments.mean.shape[1], shape, prev, move_cost, config, work)
        self.moments = moments
        self.mean, self.dev, self.var_w = moments.mean, moments.dev, moments.var_w
        self.steps = moments.dev.shape[2]  # the deviations' columns (see `step_moments`)
        self.pairs = PairCovariances(self.dev, config.cross_bytes, hold_pairs)
        share = self.n / np.maximum(self.n.sum(axis=-1, keepdims=True), 1)  # [L, E, G]
        self.mu = np.einsum("le,leg->lg", self.mean, share)
        # einsum's own loops, not a BLAS product: BLAS threads contend badly on a shared host
        per_slot = np.take_along_axis(self.dev, self.slots[:, :, None], axis=1)  # [L, slots, S]
        per_slot /= np.take_along_axis(self.n.sum(axis=-1), self.slots, axis=1)[:, :, None]
        centred = per_slot.reshape(self.layers, shape.gpus, -1, self.steps).sum(axis=2)  # [L, G, S]
        self.cov = np.einsum("les,lgs->leg", self.dev, centred) / max(self.steps, 1)  # [L, E, G]
        self.var_g = (centred**2).mean(axis=-1)  # [L, G]
        self.temperatures = temperatures(moments, shape.gpus)
        self.best_t = np.zeros(self.layers, dtype=np.int64)  # each layer's temperature, set by _peaks
        self.per_step = self._peaks(self.mu, self.var_g)
        self.objective = self._objective(np.arange(self.layers))
        self.start_objective = self.objective.copy()
        self._last: tuple[np.ndarray, ...] = ()  # the scored candidates' new moments, for _apply_all
        # the same plan scored on each half of the steps, kept in step with it move by move
        self.halves = [
            EvenSearch(self.slots, half, shape, prev, move_cost, config=config, hold_pairs=False)
            for half in (halves or ())
        ]

    def _objective(self, layers: np.ndarray) -> np.ndarray:
        return step_mean(self.per_step[layers], self.config.half_life) + self.price(layers)

    # -------------------------------------------------------------- the bound

    def _peaks(self, mu: np.ndarray, var: np.ndarray, layers: np.ndarray | None = None) -> np.ndarray:
        """[..., 1] the expected peak of GPU loads of means mu and variances var [..., G]: the
        least over temperatures t of t log sum_g exp(mu_g / t + var_g / 2t^2), a bound that is
        smooth and costs O(GPUs) per candidate; the layers' best temperatures are kept (`layers`:
        the rows of mu, all when None). One step: its peak."""
        if self.steps == 1:
            return mu.max(axis=-1, keepdims=True)
        bound = lse_at(mu[..., None, :], var[..., None, :], self.temperatures[:, None])[..., 0]  # [.., T]
        best = bound.argmin(axis=-1)
        if layers is None:
            self.best_t = best
        else:
            self.best_t[layers] = best
        return np.take_along_axis(bound, best[..., None], axis=-1)

    def _changes(
        self, layer: np.ndarray, c: Candidates, dtype: type = np.float64
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(new mean, new variance) of every GPU's load under each candidate, and the share changes
        (in `dtype`: float32 halves the work of scoring whole neighbourhoods)."""
        rows = layer[:, None]
        ne, nf = self.n[rows, c.e], self.n[rows, c.f]
        ce, cf = ne.sum(-1, keepdims=True).astype(dtype), nf.sum(-1, keepdims=True).astype(dtype)
        keep = c.swap[..., None]  # a swap keeps both replica counts; else e gives f a replica
        da = (
            c.na.astype(dtype) / np.maximum(np.where(keep, ce, ce - 1), 1) - ne.astype(dtype) / ce
        )  # [B, K, G]
        db = c.nb.astype(dtype) / np.where(keep, cf, cf + 1) - nf.astype(dtype) / cf

        def at(x: np.ndarray) -> np.ndarray:
            return x.astype(dtype, copy=False)

        mean_e, mean_f = at(self.mean[rows, c.e])[..., None], at(self.mean[rows, c.f])[..., None]
        mu = at(self.mu[layer])[:, None] + da * mean_e + db * mean_f
        cross = at(self.pairs(rows, c.e, c.f))[..., None]
        var_e, var_f = at(self.var_w[rows, c.e])[..., None], at(self.var_w[rows, c.f])[..., None]
        var = da * (da * var_e + 2 * at(self.cov[rows, c.e]) + 2 * db * cross)
        var += db * (db * var_f + 2 * at(self.cov[rows, c.f]))
        var += at(self.var_g[layer])[:, None]
        return mu, var, da, db

    def _candidate_objectives(self, c: Candidates, dtype: type = np.float64) -> np.ndarray:
        """[B, K] each candidate's objective; in float64 it also keeps their new moments for
        `_apply_all`."""
        self._last = self._changes(c.layer, c, dtype)
        if self.steps > 1:
            # each layer at the temperature that bounds its current plan best: an upper bound on a
            # candidate's bound, exact for the current plan, so an accepted move still lowers it
            t = self.temperatures[self.best_t[c.layer]][:, None, None].astype(dtype)
            score = step_mean(lse_at(self._last[0], self._last[1], t), self.config.half_life)
        else:
            score = step_mean(self._peaks(self._last[0], self._last[1]), self.config.half_life)
        return np.where(c.valid, score + self._move_costs(c), np.inf)

    # -------------------------------------------------------------- the neighbourhood

    def neighbourhood_size(self) -> int:
        """Moves `descend` scores per layer and pass (at most; some are not valid moves)."""
        return int(self._neighbourhood(np.zeros(1, dtype=np.int64)).e.shape[1])

    def _neighbourhood(self, layers: np.ndarray) -> Candidates:
        """Every move of the layers (neighbourhood.py)."""
        slots_n = self.slots.shape[1]
        means = np.asarray(self.mu[int(layers[0])]) if layers.size == 1 else None
        pairs = slot_pairs(
            slots_n, self.per_gpu, self.per_node, self.shape.gpus, means, self.config.max_neighbourhood
        )
        spare = self.n[layers[:, None], self.slots[layers]].sum(axis=-1) >= 2  # [B, slots]
        i, j, swap, found = neighbourhood(self.slots[layers], spare, pairs, self.per_gpu, self.per_node)
        return self._moves(layers, i, j, swap, found, counts=False)

    def _all_objectives(self, c: Candidates) -> np.ndarray:
        """[B, K] the objective of each candidate, as `_candidate_objectives` scores it but in
        float32 (to choose by; a chosen move is scored again in float64 before it is applied);
        swaps from the two GPUs they change (the other GPUs' terms of the bound stay). Sets no
        moments for `_apply_all`."""
        if self.steps == 1 or not c.swap.any():
            return self._candidate_objectives(self._counted(c))
        out = np.full(c.e.shape, np.inf)
        swaps = np.asarray(c.swap.all(axis=0))  # the neighbourhood's swaps share their columns
        if not swaps.all():  # in blocks of whole spare slots (each a run of a node's slots)
            at = np.flatnonzero(~swaps)
            cells = c.layer.size * self.per_node * self.shape.gpus
            width = max(1, self.config.gift_cells // cells) * self.per_node
            for first in range(0, at.size, width):
                block = np.zeros(swaps.size, dtype=bool)
                block[at[first : first + width]] = True
                out[:, block] = self._gift_objectives(c, block)
        s = columns(c, swaps)
        rows, b = s.layer[:, None], np.arange(s.layer.size)[:, None]
        f4 = np.float32
        t = self.temperatures[self.best_t[s.layer]][:, None].astype(f4)  # [B, 1]
        mu, var = self.mu[s.layer].astype(f4), self.var_g[s.layer].astype(f4)  # [B, G]
        top = mu.max(axis=-1, keepdims=True)
        expo = (mu - top) / t + var / (2 * t**2)
        peak = expo.max(axis=-1, keepdims=True)
        total = np.exp(expo - peak).sum(axis=-1, keepdims=True)  # [B, 1]
        count = self.n[s.layer].sum(axis=-1)  # [B, E] replicas of each expert
        a = (1.0 / count[b, s.e]).astype(f4)  # [B, K]
        bf = (1.0 / count[b, s.f]).astype(f4)
        shift = a * self.mean[rows, s.e].astype(f4) - bf * self.mean[rows, s.f].astype(f4)  # e leaves gi
        spread = a**2 * self.var_w[rows, s.e].astype(f4) + bf**2 * self.var_w[rows, s.f].astype(f4)
        spread -= 2 * a * bf * self.pairs(rows, s.e, s.f).astype(f4)
        kept = total - np.exp(expo[b, s.gi] - peak) - np.exp(expo[b, s.gj] - peak)  # the other GPUs
        total = np.maximum(kept, 0.0)
        # a swap that loads a GPU far past the current peak overflows float32 to inf: its value is
        # then inf, the move is never taken, and the overflow is no error
        with np.errstate(over="ignore"):
            for g, sign in ((s.gi, -1.0), (s.gj, 1.0)):
                new_mu = mu[b, g] + sign * shift
                cov = a * self.cov[rows, s.e, g].astype(f4) - bf * self.cov[rows, s.f, g].astype(f4)
                new_var = var[b, g] + spread + 2 * sign * cov
                total = total + np.exp((new_mu - top) / t + new_var / (2 * t**2) - peak)
            value = top + t * (peak + np.log(total))
        out[:, swaps] = np.where(s.valid, value + self._move_costs(s), np.inf)
        return out

    def _gift_objectives(self, c: Candidates, cols: np.ndarray) -> np.ndarray:
        """[B, gifts] in float32: the neighbourhood's gifts (columns `cols`, spare slot i by the
        node's slots j), each expert's terms taken once and broadcast over the other's."""
        b, per, f4 = c.layer.size, self.per_node, np.float32
        at = np.flatnonzero(cols)
        width = at.size // per
        i = c.i[:, at].reshape(b, width, per)[:, :, 0]  # [B, W]: the spare slots
        j = c.j[:, at].reshape(b, width, per)  # [B, W, P]: the node's slots
        if self.shape.nodes == 1:
            j = j[:, :1]  # the same slots for every spare slot
        rows, cube = c.layer[:, None], c.layer[:, None, None]
        e, gi = self.slots[rows, i], i // self.per_gpu  # [B, W]
        f = self.slots[cube, j]  # [B, 1 or W, P]
        ne = self.n[rows, e].astype(f4)  # [B, W, G]
        ce = ne.sum(axis=-1, keepdims=True)
        lose = (np.arange(self.shape.gpus) == gi[..., None]).astype(f4)  # e's replica on gi goes to f
        da = ((ne - lose) / np.maximum(ce - 1, 1) - ne / ce)[:, :, None]  # [B, W, 1, G]
        nf = self.n[cube, f].astype(f4)  # [B, 1 or W, P, G]
        cf = nf.sum(axis=-1, keepdims=True)
        db = nf * (1 / (cf + 1) - 1 / cf) + lose[:, :, None] / (cf + 1)  # [B, W, P, G]
        mean_e = self.mean[rows, e].astype(f4)[..., None, None]
        mean_f = self.mean[cube, f].astype(f4)[..., None]
        mu = self.mu[c.layer].astype(f4)[:, None, None] + da * mean_e + db * mean_f
        var_e = self.var_w[rows, e].astype(f4)[..., None, None]
        var_f = self.var_w[cube, f].astype(f4)[..., None]
        cross = self.pairs(cube, e[:, :, None], f).astype(f4)[..., None]  # [B, W, P, 1]
        var = da * (da * var_e + 2 * self.cov[rows, e].astype(f4)[:, :, None] + 2 * db * cross)
        var += db * (db * var_f + 2 * self.cov[cube, f].astype(f4))
        var += self.var_g[c.layer].astype(f4)[:, None, None]
        t = self.temperatures[self.best_t[c.layer]].astype(f4)[:, None, None, None]
        value = lse_at(mu, var, t)[..., 0]  # [B, W, P]
        if self.prev is not None:
            kept_e, kept_f = self.prev[rows, e, gi][..., None], self.prev[cube, f, gi[..., None]]
            held_e, held_f = self.n[rows, e, gi][..., None], self.n[cube, f, gi[..., None]]
            delta = np.maximum(held_e - 1 - kept_e, 0) - np.maximum(held_e - kept_e, 0)  # [B, W, 1]
            delta = delta + np.maximum(held_f + 1 - kept_f, 0) - np.maximum(held_f - kept_f, 0)
            base = moved(self.n[c.layer], self.prev[c.layer])[:, None, None]
            value = value + self.move_cost * (base + delta)
        return np.where(c.valid[:, at], value.reshape(b, -1), np.inf)

    # -------------------------------------------------------------- the halves' check

    def _cross_checked(self, c: Candidates, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """[rows, ...] whether row r's move ks[r, ...] lowers the objective, before its price, on
        every half of the steps (`ks` [rows] or [rows, k])."""
        if not self.halves or rows.size == 0:
            return np.ones(ks.shape, dtype=bool)
        ks2 = ks.reshape(rows.size, -1)
        ok = np.ones(ks2.shape, dtype=bool)
        sub = self._counted(picked(c, rows, ks2))
        price: float | np.ndarray = 0.0  # paid on the whole move; the halves judge its gain alone
        if self.prev is not None:
            price = self._move_costs(sub) - self.price(sub.layer)[:, None]
        for half in self.halves:
            value = half._candidate_objectives(sub) - price
            ok &= lower(value, half.objective[sub.layer][:, None])
        return ok.reshape(ks.shape)

    def _confirmed(
        self, c: Candidates, objective: np.ndarray, current: np.ndarray, better: np.ndarray, best: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each layer's best move among its `cross_tries` best improving candidates that also
        improve on both halves of the steps (none: the layer has no move this pass)."""
        if not self.halves or not better.any():
            return better, best
        rows = np.flatnonzero(better)
        order = np.argsort(objective[rows], axis=1, kind="stable")[:, : self.config.cross_tries]
        tried = np.take_along_axis(objective[rows], order, axis=1)
        ok = self._cross_checked(c, rows, order) & lower(tried, current[rows, None])
        better, best = better.copy(), best.copy()
        better[rows] = ok.any(axis=1)
        best[rows] = order[np.arange(rows.size), ok.argmax(axis=1)]
        return better, best

    # -------------------------------------------------------------- moves applied

    def _apply_all(self, c: Candidates, rows: np.ndarray, ks: np.ndarray) -> None:
        """Every layer's chosen move at once (one per layer, so no two touch the same rows), with
        the new moments `_candidate_objectives` kept for them."""
        if rows.size == 0:
            return
        layers = c.layer[rows]
        mu, var, da, db = (x[rows, ks] for x in self._last)
        for expert, change in ((c.e[rows, ks], da), (c.f[rows, ks], db)):
            column = self.pairs(layers[:, None], np.arange(self.experts)[None, :], expert[:, None])
            self.cov[layers] += column[:, :, None] * change[:, None, :]
        self.mu[layers], self.var_g[layers] = mu, var
        self._place(c, rows, ks)
        self.per_step[layers] = self._peaks(mu, var, layers)
        self.objective[layers] = self._objective(layers)
        for half in self.halves:
            sub = one_each(c, rows, ks)
            half._candidate_objectives(sub)
            half._apply_all(sub, np.arange(rows.size), np.zeros(rows.size, dtype=np.int64))

    def _more_moves(
        self, c: Candidates, objective: np.ndarray, current: np.ndarray, better: np.ndarray, best: np.ndarray
    ) -> None:
        """After each layer's best move: up to `extra_moves` more of the pass's candidates that
        improved on their own and touch none of the experts moved since, each scored again on the
        plan as it now is and applied only if it still lowers the objective (a fraction of a
        pass's cost each)."""
        if not self.config.extra_moves or not better.any():
            return
        rows = np.flatnonzero(better)
        touched = np.zeros((rows.size, self.experts), dtype=bool)
        local, first = np.arange(rows.size), best[rows]
        touched[local, c.e[rows, first]] = touched[local, c.f[rows, first]] = True
        alone = lower(objective[rows], current[rows, None])
        alone[local, first] = False
        for _ in range(self.config.extra_moves):
            r = np.arange(rows.size)[:, None]
            ok = alone & ~touched[r, c.e[rows]] & ~touched[r, c.f[rows]]
            live = np.flatnonzero(ok.any(axis=1))
            if live.size == 0:
                return
            k = np.where(ok[live], objective[rows[live]], np.inf).argmin(axis=1)
            sub = self._counted(one_each(c, rows[live], k))
            gain = self._candidate_objectives(sub)[:, 0]
            keep = gain < self.objective[sub.layer] - 1e-12 * np.maximum(1.0, np.abs(gain))
            firsts = np.zeros(int(keep.sum()), dtype=np.int64)
            keep[keep] = self._cross_checked(sub, np.flatnonzero(keep), firsts)
            keep = np.flatnonzero(keep)
            self._apply_all(sub, keep, np.zeros(keep.size, dtype=np.int64))
            alone[live, k] = False
            kept = live[keep]
            touched[kept, sub.e[keep, 0]] = touched[kept, sub.f[keep, 0]] = True

    # -------------------------------------------------------------- driver

    def descend(
        self,
        expired: Callable[[], bool],
        iterations: int | None = None,
        left: Callable[[], float] | None = None,
    ) -> bool:
        """Steepest descent: every move of every active layer scored (the worst layers first), each
        layer's best improving one that the halves confirm applied (and up to `extra_moves` more,
        re-scored), until no layer improves, after `iterations` passes, or when the next chunk of
        about `chunk` moves would take `self.work` past its budget (the first chunk always runs)
        or `expired()` (an opt-in clock, read before each chunk). With `left` (seconds left of
        that clock), a chunk is not begun when the last one took longer than what is left. True
        when the work budget or the clock cut it short."""
        config, gpus = self.config, self.shape.gpus
        active = np.arange(self.layers)
        took = 0.0
        limit = config.max_iterations
        per_chunk = max(1, int(config.chunk // swaps_per_layer(self.per_node, gpus)))
        per_chunk = min(per_chunk, self.pairs.layers_held(self.layers))
        for _ in range(limit if iterations is None else min(iterations, limit)):
            if active.size == 0:
                return False
            improved = np.zeros(active.size, dtype=bool)
            active = active[np.argsort(-self.objective[active], kind="stable")]
            for at in range(0, active.size, per_chunk):
                before = 0.0 if left is None else left()
                if expired() or (left is not None and before < took):
                    return True
                layers = active[at : at + per_chunk]
                c = self._neighbourhood(layers)
                pairs = self.pairs.missing(layers) * self.experts**2 * self.steps
                pair_work = config.ns_per_pair_step * pairs
                cost = config.ns_per_move * scoring_units(c.swap, gpus) + pair_work
                if self.work.used > 0 and not self.work.fits(cost):
                    return True
                self.work.spend(cost)
                improved[at : at + per_chunk] = self._pass(c, layers)
                if left is not None:
                    took = before - left()
            active = active[improved]
        return False

    def _pass(self, c: Candidates, layers: np.ndarray) -> np.ndarray:
        """[layers] whether each layer made a move: its best confirmed one (re-scored in float64,
        since float32 only chose it), then `_more_moves`."""
        objective = self._all_objectives(c)
        best = objective.argmin(axis=1)
        current = self.objective[layers]
        better = lower(objective[np.arange(layers.size), best], current)
        better, best = self._confirmed(c, objective, current, better, best)
        rows = np.flatnonzero(better)
        chosen = self._counted(one_each(c, rows, best[rows]))
        exact = self._candidate_objectives(chosen)[:, 0]  # float64, and their new moments
        held = lower(exact, current[rows])
        better[rows[~held]] = False
        self._apply_all(chosen, np.flatnonzero(held), np.zeros(int(held.sum()), dtype=np.int64))
        self._more_moves(c, objective, current, better, best)
        return better
