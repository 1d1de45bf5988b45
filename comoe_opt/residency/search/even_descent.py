"""Steepest descent on the even split's objective (`policy.split = "even"`): the slow loop's plan,
whose replica counts and places the best-split models chose, re-arranged for the dispatch the
engine does (residency/even_split.py).

Under the even split a replica's share is its expert's tokens over the expert's replica count, so
a replica's place and every expert's count both set the chiplets' loads. A pass looks at the
layer's hot chiplets, those that are some scenario's peak, the most often first, and scores
every move off the first one that has an improving move, exactly on every scenario:

* swap — its replica of e trades places with a replica of f on chiplet d: two chiplets change;
* replace — its replica of e becomes one of f, or a replica of e elsewhere becomes one of f
  held on the hot chiplet (f's share there shrinks): e's other replicas take larger shares and
  f's smaller, so every chiplet holding either changes;
* drop — its replica of e goes: where a busy replica's page read outweighs its share of the
  tokens (`balance = "work"`), fewer replicas are faster. Not with `policy.layer_slots` (serving
  GPUs): an engine's slot map is full and every slot takes its share, so each free slot is first
  given the replica of least objective (`fill`), and the moves keep every slot.

None adds a page to a chiplet, so capacity, the budget and `policy.layer_slots` hold by
construction; the best move that lowers the layer's share of the objective,
`W · (mean scenario makespan + NoP + misses) + κ · copies`, and keeps moves.py's rules (leases,
quotas, the replica limit, all_resident) is applied. At most `problem.search_moves` moves per
layer: bounded by work, the same plan on any machine. Where no move lowers the objective, one
that keeps it and lowers the scenarios' sum of squared loads is taken: a max has plateaus (two
chiplets at the peak), and this lets a pass unload one of them so that the next can lower it.
"""

from __future__ import annotations

import numpy as np

from comoe_opt.best_split.cut_condition import int_masks
from comoe_opt.deadline import Deadline
from comoe_opt.residency.even_split import replica_work, shares
from comoe_opt.residency.placement import Placement
from comoe_opt.residency.problem import ResidencyProblem
from comoe_opt.residency.search.moves import MoveRules

TOLERANCE = 1e-9  # relative: a move must lower the layer's objective by more than round-off
# relative: how much a plateau move (one that lowers the loads' squares) may raise the objective,
# e.g. by NoP a millionth of the balance term; the best plan seen is kept, so none is worse
PLATEAU = 1e-6
SHORTLIST = 16  # replaces scored per expert on the hot chiplet, of each kind: a work limit
CHUNK_CELLS = 2**22  # (candidate, scenario, chiplet) loads scored at once: 32 MB


def even_descent(
    problem: ResidencyProblem, placement: Placement, deadline: Deadline | None = None
) -> Placement:
    """`placement` improved for the even split (unchanged for the best split or without moves);
    never worse on the even objective. A `deadline`, checked between layers, may cut it short."""
    if problem.split != "even" or problem.search_moves == 0:
        return placement
    resident = placement.resident.copy()
    room = np.array([t.max_pages - int(resident[t.owns].sum()) for t in problem.tenants], dtype=np.int64)
    pages = resident.sum(axis=(0, 1))  # [C] pages each chiplet holds
    for layer in range(problem.layers):
        if deadline is not None and deadline.expired():
            deadline.note(f"even-split descent: stopped by the time limit after {layer} layers")
            break
        descent = _LayerDescent(problem, resident[layer], layer, room)
        if problem.layer_slots:
            descent.fill(pages)
        descent.run()
    return Placement(resident)


class _LayerDescent:
    """One layer's replicas `held` [E, C] (changed in place) with each scenario's chiplet loads
    and each expert's own terms kept exact move by move."""

    def __init__(self, problem: ResidencyProblem, held: np.ndarray, layer: int, room: np.ndarray) -> None:
        self.p, self.held, self.layer, self.room = problem, held, layer, room
        self.rules = MoveRules.of(problem, layer)
        prev = problem.previous.resident[layer] if problem.previous is not None else np.zeros_like(held)
        self.fresh = ~prev  # [E, C] a replica here is a copy
        self.nop = problem.nop_ms_per_token
        self.tokens, self.miss = problem.tokens[layer], problem.miss_ms[layer]
        self.change = 0.0  # the objective's change so far
        self._refresh()

    def _refresh(self) -> None:
        held, r = self.held, self.held.sum(axis=1)
        self.r = r
        self.now = replica_work(self.p, self.layer, r)  # [S, E, C]
        self.fewer = replica_work(self.p, self.layer, r - 1)
        self.more = replica_work(self.p, self.layer, r + 1)
        self.loads = np.einsum("sec,ec->sc", self.now, shares(held))
        self.nopsum = (held * self.nop).sum(axis=1)
        self.copies = (held & self.fresh).sum(axis=1)
        self.spread = float((self.loads**2).sum(axis=1).mean())  # the tie-break: loads' squares

    def _moved(self, x: np.ndarray) -> None:
        """Bring the state up to date after a move changed experts x's replicas: their work rows
        recomputed, the loads summed afresh (summed in the same order as `_refresh`, so that the
        plan does not hang on round-off the moves would accumulate)."""
        held = self.held[x]
        self.r[x] = held.sum(axis=1)
        self.now[:, x] = replica_work(self.p, self.layer, self.r[x], x)
        self.fewer[:, x] = replica_work(self.p, self.layer, self.r[x] - 1, x)
        self.more[:, x] = replica_work(self.p, self.layer, self.r[x] + 1, x)
        self.loads = np.einsum("sec,ec->sc", self.now, shares(self.held))  # in full: no drift
        self.nopsum[x] = (held * self.nop).sum(axis=1)
        self.copies[x] = (held & self.fresh[x]).sum(axis=1)
        self.spread = float((self.loads**2).sum(axis=1).mean())

    def fill(self, pages: np.ndarray) -> None:
        """Give each free slot of the layer (`layer_slots` less the replicas a chiplet holds, while
        its capacity and the budget allow; `pages` [C] updated) a replica, the add of least
        objective first: an engine's slot map is full, and under the even split every slot takes
        a share."""
        p, held = self.p, self.held
        while int(pages.sum()) < p.budget_pages:
            free = np.flatnonzero((held.sum(axis=0) < p.layer_slots) & (pages < p.capacity_pages))
            base = float(self.loads.max(axis=1).mean())
            best: tuple[float, int, int] | None = None
            for c in free:
                f = np.flatnonzero(~held[:, c])
                loads = self.loads[None] + self._gains(f, np.full(len(f), c))
                delta = p.batches * (loads.max(axis=2).mean(axis=1) - base) + self._gained(f, int(c))
                for i in np.argsort(delta, kind="stable"):
                    if best is not None and delta[i] >= best[0]:
                        break
                    if self.rules.add_allowed(int(f[i]), int_masks(held[[f[i]]])[0], int(c), self.room):
                        best = (float(delta[i]), int(f[i]), int(c))
                        break
            if best is None:
                return
            _, f_best, c_best = best
            x = np.array([f_best])
            held[f_best, c_best] = True
            pages[c_best] += 1
            if self.rules.owner.shape[0]:
                self.room -= self.rules.owner[:, f_best]
            self._moved(x)

    def run(self) -> None:
        """At most `search_moves` moves; `held` left at the best plan seen."""
        best, best_held, best_room = 0.0, self.held.copy(), self.room.copy()
        for _ in range(self.p.search_moves):
            if not self._step():
                break
            if self.change < best - TOLERANCE * max(1.0, abs(best)):
                best, best_held, best_room = self.change, self.held.copy(), self.room.copy()
        self.held[:], self.room[:] = best_held, best_room  # the tenants' room goes back with the plan

    def _step(self) -> bool:
        peaks = self.loads.max(axis=1)
        # chiplets at some scenario's peak (ties all count), the most often first
        hot = (self.loads >= peaks[:, None] * (1 - TOLERANCE)).sum(axis=0)
        for h in np.argsort(-hot, kind="stable")[: int((hot > 0).sum())]:
            if self._move_off(int(h), float(peaks.mean())):
                return True
        return False

    def _terms(self, e: np.ndarray, r: np.ndarray, nopsum: np.ndarray, copies: np.ndarray) -> np.ndarray:
        """Experts e's `W · (NoP + miss) + κ · copies` with r replicas of NoP sum `nopsum`."""
        least = float(self.nop.min()) if self.nop.size else 0.0
        nop = np.where(r > 0, nopsum / np.maximum(r, 1), least)
        own = self.tokens[e] * nop + self.miss[e] * (r == 0)
        return self.p.batches * own + self.p.copy_ms * copies

    def _lost(self, e: np.ndarray, c: np.ndarray | int) -> np.ndarray:
        """The change of experts e's own terms when each loses its replica on c."""
        r, nopsum, copies = self.r[e], self.nopsum[e], self.copies[e]
        return self._terms(e, r - 1, nopsum - self.nop[c], copies - self.fresh[e, c]) - self._terms(
            e, r, nopsum, copies
        )

    def _gained(self, f: np.ndarray, c: np.ndarray | int) -> np.ndarray:
        """The change of experts f's own terms when each gains a replica on c."""
        r, nopsum, copies = self.r[f], self.nopsum[f], self.copies[f]
        return self._terms(f, r + 1, nopsum + self.nop[c], copies + self.fresh[f, c]) - self._terms(
            f, r, nopsum, copies
        )

    def _move_off(self, h: int, base: float) -> bool:
        """Apply the best allowed improving move off chiplet h; whether there was one."""
        kinds = [(self._swap, *self._swaps(h, base)), (self._replace, *self._replaces(h, base))]
        if not self.p.layer_slots:  # an engine's slot map is full: every slot holds a replica
            kinds.append((self._drop, *self._drops(h, base)))
        return self._apply_best(kinds, base, plateau=True)

    def _apply_best(self, kinds: list[tuple], base: float, plateau: bool) -> bool:
        """Apply the best allowed move of `kinds` (each: how to apply one, [*, K] the moves, [K]
        objective changes, [K] squares' changes) that lowers the objective or, with `plateau`,
        keeps it within PLATEAU and lowers the squares; whether one was applied."""
        ends = np.cumsum([len(k[2]) for k in kinds])  # candidate i is of kind searchsorted(ends, i, "right")
        deltas = np.concatenate([k[2] for k in kinds])
        spreads = np.concatenate([k[3] for k in kinds])
        scale = max(1.0, self.p.batches * base)
        lower = deltas < -TOLERANCE * scale
        order = np.flatnonzero(lower)[np.argsort(deltas[lower], kind="stable")]
        if plateau:  # a max has plateaus (a peak other chiplets share): lower spread, same peak
            level = ~lower & (deltas <= PLATEAU * scale) & (spreads < -TOLERANCE * max(1.0, self.spread))
            order = np.concatenate([order, np.flatnonzero(level)[np.argsort(spreads[level], kind="stable")]])
        for i in order:
            kind = int(np.searchsorted(ends, i, side="right"))
            apply, moves = kinds[kind][0], kinds[kind][1]
            if apply(*(int(x) for x in moves[:, i - (ends[kind - 1] if kind else 0)])):
                self.change += float(deltas[i])
                return True
        return False

    def _largest_off(self, touched: np.ndarray) -> np.ndarray:
        """[K, S] each scenario's largest load on a chiplet outside `touched[k]` ([K, C]), read
        from its top loads (one more than the largest set; -inf where every chiplet is touched)."""
        top = min(int(touched.sum(axis=1).max(initial=0)) + 1, self.loads.shape[1])
        order = np.argsort(-self.loads, axis=1, kind="stable")[:, :top]  # [S, T]
        values = np.take_along_axis(self.loads, order, axis=1)
        return np.where(touched[:, order], -np.inf, values[None]).max(axis=2)

    def _swaps(self, h: int, base: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """([4, K] (h, e, f, d) of every swap of a replica on h, [K] each one's objective change,
        [K] each one's change of the scenarios' mean sum of squared loads)."""
        held, now, loads = self.held, self.now, self.loads
        on_h = np.flatnonzero(held[:, h])  # [A] the replicas on h
        fs, ds = np.nonzero(held)
        fs, ds = fs[ds != h], ds[ds != h]  # [B] the replicas elsewhere
        ok = (on_h[:, None] != fs) & ~held[on_h[:, None], ds] & ~held[fs, h]  # [A, B]
        # [S, A, B] the two chiplets' new loads: h's terms by replica on h, d's by replica elsewhere
        new_h = (loads[:, h, None] - now[:, on_h, h])[:, :, None] + now[:, fs, h][:, None, :]
        new_d = (loads[:, ds] - now[:, fs, ds])[:, None, :] + now[:, on_h[:, None], ds]
        touched = np.zeros((len(ds), loads.shape[1]), dtype=bool)  # [B, C]: h and d
        touched[:, h] = True
        touched[np.arange(len(ds)), ds] = True
        rest = self._largest_off(touched).T[:, None, :]
        a, b = np.nonzero(ok)  # e-major, as the moves are listed
        e, f, d = on_h[a], fs[b], ds[b]
        peak = np.maximum(np.maximum(new_h, new_d), rest).mean(axis=0)[a, b]
        square = new_h**2 - loads[:, h, None, None] ** 2 + new_d**2 - loads[:, None, ds] ** 2
        spread = square.mean(axis=0)[a, b]
        nop_shift = self.nop[d] - self.nop[h]
        e_copies = self.copies[e] - self.fresh[e, h] + self.fresh[e, d]
        f_copies = self.copies[f] - self.fresh[f, d] + self.fresh[f, h]
        terms = self._terms(e, self.r[e], self.nopsum[e] + nop_shift, e_copies)
        terms += self._terms(f, self.r[f], self.nopsum[f] - nop_shift, f_copies)
        terms -= self._terms(e, self.r[e], self.nopsum[e], self.copies[e])
        terms -= self._terms(f, self.r[f], self.nopsum[f], self.copies[f])
        moves = np.stack([np.full(len(e), h), e, f, d])
        return moves, self.p.batches * (peak - base) + terms, spread

    def _replaces(self, h: int, base: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """([3, K] (e, c, f) of replaces that unload h, [K] each one's objective and squares'
        changes: a replica on h becomes one of the `SHORTLIST` experts off h that add least work
        to h; for each expert f on h, the `SHORTLIST` replicas elsewhere (e on c) whose chiplet
        would carry least after becoming one of f (f's share on h shrinks)."""
        held = self.held
        on_h, off_h = np.flatnonzero(held[:, h]), np.flatnonzero(~held[:, h])
        gains_h = off_h[np.argsort(self.more[:, off_h, h].mean(axis=0), kind="stable")[:SHORTLIST]]
        away, where = np.nonzero(held)
        away, where = away[where != h], where[where != h]
        after = (self.loads[:, where] - self.now[:, away, where]).mean(axis=0)  # [A]
        after = after + self.more[:, on_h[:, None], where[None, :]].mean(axis=0)  # [F, A]
        after[held[on_h[:, None], where[None, :]] | (on_h[:, None] == away[None, :])] = np.inf
        picked = np.argsort(after, axis=1, kind="stable")[:, :SHORTLIST]  # [F, <= SHORTLIST]
        e = np.concatenate([np.repeat(on_h, len(gains_h)), away[picked].ravel()])
        c = np.concatenate([np.full(len(on_h) * len(gains_h), h), where[picked].ravel()])
        f = np.concatenate([np.tile(gains_h, len(on_h)), np.repeat(on_h, picked.shape[1])])
        ok = (e != f) & ~held[f, c] & (self.r[f] < self.rules.max_replicas)
        if self.rules.all_resident:  # moves.py refuses these anyway: not worth scoring
            ok &= self.r[e] >= 2
        e, c, f = e[ok], c[ok], f[ok]
        peaks, spread = self._replace_scores(e, c, f)
        terms = self._lost(e, c) + self._gained(f, c)
        return np.stack([e, c, f]), self.p.batches * (peaks - base) + terms, spread

    def _replace_scores(self, e: np.ndarray, c: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([K] mean scenario peak, [K] change of the mean sum of squared loads) after each
        replace (e[k] on c[k] becomes f[k]). Where e keeps a replica and f had one, only the
        chiplets holding either change (`_local_scores`); otherwise a spread load changes every
        chiplet, scored in full."""
        peaks, spread = np.empty(len(e)), np.empty(len(e))
        local = (self.r[e] >= 2) & (self.r[f] >= 1)
        i = np.flatnonzero(local)
        touched = self._touched(e[i], c[i], f[i])
        width = int(touched.sum(axis=1).max(initial=1))
        cells = max(1, CHUNK_CELLS // max(1, self.loads.shape[0] * width))
        for k in range(0, len(i), cells):
            part = i[k : k + cells]
            peaks[part], spread[part] = self._local_scores(e[part], c[part], f[part], touched[k : k + cells])
        i = np.flatnonzero(~local)
        cells = max(1, CHUNK_CELLS // max(1, self.loads.size))
        for k in range(0, len(i), cells):
            part = i[k : k + cells]
            loads = self.loads[None] + self._losses(e[part], c[part]) + self._gains(f[part], c[part])
            peaks[part] = loads.max(axis=2).mean(axis=1)
            spread[part] = (loads**2).sum(axis=2).mean(axis=1) - self.spread
        return peaks, spread

    def _touched(self, e: np.ndarray, c: np.ndarray, f: np.ndarray) -> np.ndarray:
        """[K, C] the chiplets a replace changes: e's, f's and c."""
        touched = self.held[e] | self.held[f]
        touched[np.arange(len(e)), c] = True
        return touched

    def _local_scores(
        self, e: np.ndarray, c: np.ndarray, f: np.ndarray, touched: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """`_replace_scores` of replaces that change only the chiplets `touched` [K, C] (`_touched`:
        those holding e or f, where e keeps a replica and f had one): the new loads there, and each
        scenario's largest load elsewhere (`_largest_off`)."""
        width = int(touched.sum(axis=1).max())
        idx = np.argsort(~touched, axis=1, kind="stable")[:, :width]  # [K, M] the touched chiplets first
        ee, ff = e[:, None], f[:, None]
        at_c = idx == c[:, None]
        # [S, K, M]: e's other replicas take larger shares, its replica on c goes; f's take
        # smaller shares and one arrives on c (padding chiplets: no change)
        delta = (self.held[ee, idx] & ~at_c) * (self.fewer[:, ee, idx] - self.now[:, ee, idx])
        delta += self.held[ff, idx] * (self.more[:, ff, idx] - self.now[:, ff, idx])
        delta += at_c * (self.more[:, ff, idx] - self.now[:, ee, idx])
        base = self.loads[:, idx]  # [S, K, M]
        new = base + delta
        rest = self._largest_off(touched)  # [K, S]
        peaks = np.maximum(new.max(axis=2).T, rest).mean(axis=1)
        spread = (new**2 - base**2).sum(axis=2).mean(axis=0)
        return peaks, spread

    def _losses(self, e: np.ndarray, c: np.ndarray) -> np.ndarray:
        """[K, S, C] the loads' change when expert e[k] loses its replica on c[k]: its other
        chiplets take larger shares; with none left, its work is spread over every chiplet."""
        k = np.arange(len(e))
        lose = self.held[e][:, None, :] * (self.fewer[:, e] - self.now[:, e]).transpose(1, 0, 2)
        lose[k, :, c] = -self.now[:, e, c].T
        last = self.r[e] == 1
        lose += last[:, None, None] * self.fewer[:, e].transpose(1, 0, 2) / self.held.shape[1]
        return lose

    def _gains(self, f: np.ndarray, c: np.ndarray) -> np.ndarray:
        """[K, S, C] the loads' change when expert f[k] gains a replica on c[k]: its chiplets take
        smaller shares (none before: its spread work goes)."""
        k = np.arange(len(f))
        gain = self.held[f][:, None, :] * (self.more[:, f] - self.now[:, f]).transpose(1, 0, 2)
        gain[k, :, c] += self.more[:, f, c].T
        gain -= (self.r[f] == 0)[:, None, None] * self.now[:, f].transpose(1, 0, 2) / self.held.shape[1]
        return gain

    def _drops(self, h: int, base: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """([2, K] (h, e) of every drop of a replica on h, [K] its objective and squares' changes)."""
        e = np.flatnonzero(self.held[:, h])
        loads = self.loads[None] + self._losses(e, np.full(len(e), h))  # [K, S, C]
        peaks, spread = loads.max(axis=2).mean(axis=1), (loads**2).sum(axis=2).mean(axis=1)
        terms = self._lost(e, h)
        return (
            np.stack([np.full(len(e), h), e]),
            self.p.batches * (peaks - base) + terms,
            spread - self.spread,
        )

    def _drop(self, h: int, e: int) -> bool:
        if not self.rules.drop_allowed(e, int_masks(self.held[[e]])[0], h):
            return False
        x = np.array([e])
        self.held[e, h] = False
        if self.rules.owner.shape[0]:
            self.room += self.rules.owner[:, e]
        self._moved(x)
        return True

    def _swap(self, h: int, e: int, f: int, d: int) -> bool:
        masks = int_masks(self.held[[e, f]])
        if not self.rules.swap_allowed(e, masks[0], h, f, masks[1], d):
            return False
        x = np.array([e, f])
        self.held[e, h], self.held[f, d], self.held[e, d], self.held[f, h] = False, False, True, True
        self._moved(x)
        return True

    def _replace(self, e: int, c: int, f: int) -> bool:
        masks = int_masks(self.held[[e, f]])
        if not self.rules.replace_allowed(e, masks[0], c, f, masks[1], self.room):
            return False
        x = np.array([e, f])
        self.held[e, c], self.held[f, c] = False, True
        if self.rules.owner.shape[0]:
            self.room -= self.rules.owner[:, f] - self.rules.owner[:, e]
        self._moved(x)
        return True
