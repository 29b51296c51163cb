import itertools
import json

import numpy as np
import pytest

from state_tracking import GroupTask, StateMachineTask, get_task, load_task, load_task_from_dir, save_task

LAMP = {
    "name": "lamp",
    "states": ["off", "on"],
    "initial_state": "off",
    "operations": {"press": {"off": "on", "on": "off"}, "wait": {"off": "off", "on": "on"}},
    "text": {
        "initial": "The lamp is {state}.",
        "query": "The lamp is",
        "operations": {"press": "Press the switch.", "wait": "Wait a minute."},
    },
}


def op(task, name):
    return task.op_names.index(name)


def parity(perms: np.ndarray) -> np.ndarray:
    """Number of inversions mod 2 per row.  # (n,)"""
    inversions = sum((perms[:, i] > perms[:, j]).astype(int)
                     for i, j in itertools.combinations(range(perms.shape[1]), 2))
    return inversions % 2


# ---------------------------------------------------------------------------------------------
# Group tasks and the convention new_state[b] = state[p[b]]
# ---------------------------------------------------------------------------------------------
def test_swap_convention_by_hand():
    task = get_task("swap_s5")
    # Boxes hold (apple, banana, cherry, grape, lemon) = (0, 1, 2, 3, 4).
    # swap (1 2): (banana, apple, cherry, grape, lemon) = (1, 0, 2, 3, 4)
    # swap (2 3): box 2 <-> box 3 -> (banana, cherry, apple, grape, lemon) = (1, 2, 0, 3, 4)
    ops = np.array([[op(task, "swap_1_2"), op(task, "swap_2_3")]])
    states = task.prefix_states(ops)
    assert states.shape == (1, 3, 5)
    np.testing.assert_array_equal(states[0], [[0, 1, 2, 3, 4], [1, 0, 2, 3, 4], [1, 2, 0, 3, 4]])
    assert task.op_texts[op(task, "swap_2_4")] == "Swap the contents of Box 2 and Box 4."


def test_s5_right_multiplication_order_by_hand():
    task = get_task("s5")
    # perm_23451: box b receives box b+1's item -> (b, c, d, e, a) = (1, 2, 3, 4, 0)
    # then perm_21345 (swap boxes 1, 2)         -> (c, b, d, e, a) = (2, 1, 3, 4, 0)
    # (left multiplication would give (a, c, d, e, b) instead.)
    ops = np.array([[op(task, "perm_23451"), op(task, "perm_21345")]])
    np.testing.assert_array_equal(task.prefix_states(ops)[0, -1], [2, 1, 3, 4, 0])


def test_a5_three_cycle_by_hand():
    task = get_task("a5")
    # cycle_1_2_3 moves box 1's item to box 2, box 2's to box 3, box 3's to box 1:
    # (a, b, c, d, e) -> (c, a, b, d, e) -> (b, c, a, d, e) -> (a, b, c, d, e)
    ops = np.full((1, 3), op(task, "cycle_1_2_3"))
    np.testing.assert_array_equal(
        task.prefix_states(ops)[0], [[0, 1, 2, 3, 4], [2, 0, 1, 3, 4], [1, 2, 0, 3, 4], [0, 1, 2, 3, 4]]
    )
    assert task.op_texts[op(task, "cycle_1_2_3")] == ("Move the contents of Box 1 to Box 2, Box 2 to Box 3 and Box 3 "
                                                      "to Box 1.")


def test_operation_sets():
    swap = get_task("swap_s5")
    assert swap.num_ops == 11 and swap.op_names[0] == "identity"
    np.testing.assert_array_equal(swap.perms[0], np.arange(5))
    moved = (swap.perms != np.arange(5)).sum(axis=1)
    assert moved[0] == 0 and (moved[1:] == 2).all()
    assert len({tuple(p) for p in swap.perms}) == 11

    s5 = get_task("s5")
    assert s5.num_ops == 120 and len({tuple(p) for p in s5.perms}) == 120

    a5 = get_task("a5")
    assert a5.num_ops == 20 and len({tuple(p) for p in a5.perms}) == 20
    assert ((a5.perms != np.arange(5)).sum(axis=1) == 3).all()  # 3-cycles move exactly 3 boxes
    assert (parity(a5.perms) == 0).all()
    for task in (swap, s5, a5):
        assert task.num_queries == 5 and task.query_names[0] == "box_1"
        assert task.candidate_names == ["apple", "banana", "cherry", "grape", "lemon"]


def test_a5_states_stay_even_and_reach_all_60():
    task = get_task("a5")
    states = task.prefix_states(task.sample_ops(np.random.default_rng(0), 300, 12))  # (300, 13, 5)
    flat = states.reshape(-1, 5)
    assert (parity(flat) == 0).all()
    assert len({tuple(s) for s in flat}) == 60


def test_s5_reaches_odd_states():
    task = get_task("s5")
    final = task.final_states(task.sample_ops(np.random.default_rng(0), 200, 3))
    assert set(parity(final)) == {0, 1}


def test_sampling_is_deterministic_and_uniform():
    task = get_task("swap_s5")
    a = task.sample_ops(np.random.default_rng(7), 4000, 8)
    b = task.sample_ops(np.random.default_rng(7), 4000, 8)
    c = task.sample_ops(np.random.default_rng(8), 4000, 8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.shape == (4000, 8) and a.min() == 0 and a.max() == 10
    counts = np.bincount(a.reshape(-1), minlength=11) / a.size
    assert np.abs(counts - 1 / 11).max() < 0.01


def test_random_initial_relabels_items():
    # z_t(initial) = initial ∘ p_1 ∘ ... ∘ p_t, so box b holds initial[z_t(identity)[b]].
    task = get_task("s5")
    rng = np.random.default_rng(1)
    ops = task.sample_ops(rng, 50, 6)
    initial = task.sample_initial(rng, 50)
    assert (np.sort(initial, axis=1) == np.arange(5)).all() and not (initial == np.arange(5)).all()
    from_identity = task.prefix_states(ops)
    np.testing.assert_array_equal(task.prefix_states(ops, initial),
                                  np.take_along_axis(initial[:, None, :].repeat(7, 1), from_identity, axis=2))
    np.testing.assert_array_equal(task.final_states(ops, initial), task.prefix_states(ops, initial)[:, -1])


def test_bad_ops_and_initial():
    task = get_task("swap_s5")
    with pytest.raises(ValueError, match=r"outside \[0, 11\)"):
        task.prefix_states(np.array([[0, 11]]))
    with pytest.raises(ValueError, match="shape \\(n, depth\\)"):
        task.prefix_states(np.array([0, 1]))
    with pytest.raises(ValueError, match="exactly one box"):
        task.prefix_states(np.zeros((1, 2), dtype=int), initial=np.array([[0, 0, 1, 2, 3]]))
    with pytest.raises(ValueError, match="shape \\(1, 5\\)"):
        task.prefix_states(np.zeros((1, 2), dtype=int), initial=np.array([[0, 1, 2]]))
    with pytest.raises(ValueError, match="non-negative"):
        task.sample_ops(np.random.default_rng(0), 2, -1)


def test_get_task_errors():
    with pytest.raises(ValueError, match="unknown task name 'd8'.*swap_s5"):
        get_task("d8")
    with pytest.raises(ValueError, match="exactly 5 items"):
        get_task("s5", items=["a", "b"])
    with pytest.raises(ValueError, match="duplicate entries \\['pear'\\]"):
        get_task("s5", items=["pear", "pear", "fig", "kiwi", "lime"])
    with pytest.raises(ValueError, match="both"):
        get_task("swap_s5", items=["identity", "pear", "fig", "kiwi", "lime"])


# ---------------------------------------------------------------------------------------------
# User state machines
# ---------------------------------------------------------------------------------------------
def test_state_machine_by_hand():
    task = load_task(LAMP)
    assert isinstance(task, StateMachineTask)
    assert task.candidate_names == ["off", "on"] and task.op_names == ["press", "wait"]
    assert task.num_queries == 1 and task.query_names == ["state"]
    # off --press--> on --wait--> on --press--> off --press--> on
    ops = np.array([[0, 1, 0, 0]])
    np.testing.assert_array_equal(task.prefix_states(ops)[0, :, 0], [0, 1, 1, 0, 1])
    # from "on": on --press--> off --wait--> off
    np.testing.assert_array_equal(task.prefix_states(np.array([[0, 1]]), initial=np.array([[1]]))[0, :, 0], [1, 0, 0])
    assert task.initial_text(np.array([1])) == "The lamp is on."
    assert task.op_texts == ["Press the switch.", "Wait a minute."]


def test_state_machine_defaults():
    task = load_task({"states": ["a", "b"], "operations": {"flip": {"a": "b", "b": "a"}}})
    assert task.name == "state_machine" and task.initial_state == "a"
    assert task.op_texts == ["Apply flip."] and task.query_texts == ["The state is"]


def test_task_round_trips(tmp_path):
    for task in (get_task("swap_s5"), get_task("a5", items=["pear", "fig", "kiwi", "lime", "plum"]), load_task(LAMP)):
        rebuilt = load_task(json.loads(json.dumps(task.to_dict())))
        assert rebuilt == task and type(rebuilt) is type(task)
        save_task(task, tmp_path / task.name)
        assert load_task_from_dir(tmp_path / task.name) == task
    assert isinstance(load_task({"group": "s5"}), GroupTask)
    path = tmp_path / "lamp.json"
    path.write_text(json.dumps(LAMP))
    assert load_task(str(path)) == load_task(LAMP)
    with pytest.raises(FileNotFoundError, match="state_tracking_task.json"):
        load_task_from_dir(tmp_path)


def with_changes(**changes):
    spec = json.loads(json.dumps(LAMP))
    for key, value in changes.items():
        if value is None:
            spec.pop(key)
        else:
            spec[key] = value
    return spec


@pytest.mark.parametrize(
    "spec, message",
    [
        (with_changes(operations={"press": {"off": "on"}, "wait": {"off": "off", "on": "on"}}),
         "'press' is not total.*\\['on'\\]"),
        (with_changes(operations={"press": {"off": "on", "on": "dim"}}), "'press' leads to unknown state.*'dim'"),
        (with_changes(operations={"press": {"off": "on", "on": "off", "dim": "on"}}),
         "unknown state\\(s\\) \\['dim'\\]"),
        (with_changes(states=[]), "'states' must be a non-empty list"),
        (with_changes(states=["off", "on", "off"]), "'states' has duplicate entries \\['off'\\]"),
        (with_changes(states=None), "missing 'states'"),
        (with_changes(operations=None), "missing 'operations'"),
        (with_changes(operations={}), "'operations' must be a non-empty mapping"),
        (with_changes(initial_state="dim"), "'initial_state' 'dim' is not one of the states"),
        (with_changes(operations={"on": {"off": "on", "on": "off"}}), "both 'operations' and 'states'"),
        (with_changes(states=["off", "Yes"]), "'Yes' is reserved"),
        (with_changes(states=["off", "half on"]), "letters, digits and underscores"),
        (with_changes(typo=1), "unknown key\\(s\\) \\['typo'\\]"),
        (with_changes(text={"initial": "The lamp is lit.", "query": "The lamp is",
                            "operations": LAMP["text"]["operations"]}), "'\\{state\\}'"),
        (with_changes(text={"operations": {"press": "Press."}}), "missing \\['wait'\\]"),
        (with_changes(text={"operations": {"press": "P.", "wait": "W.", "kick": "K."}}), "unknown \\['kick'\\]"),
        ({"group": "s5", "boxes": 5}, "unknown key\\(s\\) \\['boxes'\\]"),
        ({"group": "s6"}, "unknown task name 's6'"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        load_task(spec)


def test_bad_spec_files(tmp_path):
    duplicate_op = tmp_path / "dup.json"
    duplicate_op.write_text(
        '{"states": ["off", "on"], "operations": {"press": {"off": "on", "on": "off"}, '
        '"press": {"off": "off", "on": "on"}}}'
    )
    with pytest.raises(ValueError, match="duplicate key\\(s\\) \\['press'\\]"):
        load_task(duplicate_op)
    broken = tmp_path / "broken.json"
    broken.write_text('{"states": ["off", ')
    with pytest.raises(ValueError, match="not valid JSON"):
        load_task(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        load_task(listed)
    with pytest.raises(ValueError, match="path to a JSON file or a dict"):
        load_task(42)


def test_the_short_wording_of_a_group_task_round_trips_and_a_bad_one_is_named():
    short = load_task({"group": "swap_s5", "text": "short"})
    assert short.op_texts[:3] == ["skip.", "swap 1 2.", "swap 1 3."]
    assert short.query_texts == get_task("swap_s5").query_texts  # the questions do not change
    assert load_task(short.to_dict()) == short and short.to_dict()["text"] == "short"
    assert "text" not in get_task("swap_s5").to_dict()  # the default is not written: older specs are unchanged
    assert load_task({"group": "s5", "text": "short"}).op_texts[3] == "move 1 2 4 5 3."  # box 3 gets box 4's item, …
    with pytest.raises(ValueError, match=r"group task 'text' must be one of \['long', 'short'\]; got 'tiny'"):
        load_task({"group": "swap_s5", "text": "tiny"})
