"""waits.policy: the one decision of every wait's budgets, against the rules its docstring states."""
import os

from shmcoll._env import Settings
from shmcoll.waits import SLEEP_AT_ONCE, Budgets, policy

CPUS = len(os.sched_getaffinity(0))


def test_inline_on_one_node_spins_then_yields():
    chosen = policy(Settings(), CPUS, across_nodes=False)
    assert chosen.inline == Budgets(20_000, 500_000, False)
    assert chosen.background == SLEEP_AT_ONCE


def test_more_ranks_than_cores_yield_only_in_company():
    chosen = policy(Settings(), CPUS + 1, across_nodes=False)
    assert chosen.inline == Budgets(0, 200_000, True)
    assert chosen.inline.company(CPUS + 1) == CPUS + 1
    assert chosen.background == SLEEP_AT_ONCE


def test_across_nodes_every_wait_sleeps_at_once():
    chosen = policy(Settings(), 2, across_nodes=True)
    assert chosen.inline == chosen.background == SLEEP_AT_ONCE


def test_explicit_budgets_apply_everywhere():
    for across_nodes in (False, True):
        chosen = policy(Settings(spin_us=3.0, yield_us=7.5), 2, across_nodes)
        assert chosen.inline == chosen.background == Budgets(3_000, 7_500, False)
        only_yield = policy(Settings(yield_us=0.0), 2, across_nodes)
        assert only_yield.inline == only_yield.background == Budgets(20_000, 0, False)


class _Arena:
    def __init__(self):
        self.budgets = []

    def set_waits(self, budgets):
        self.budgets.append(budgets)


def test_apply_gives_the_arena_the_thread_s_budgets():
    chosen, arena = policy(Settings(), 2, across_nodes=False), _Arena()
    chosen.apply(arena, background=True)
    chosen.apply(arena, background=False)
    chosen.apply(None, background=True)  # no arena: nothing to do
    assert arena.budgets == [chosen.background, chosen.inline]
