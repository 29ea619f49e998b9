"""apps/grpo/train.py with a user's own data file and reward module (TRL's `trl grpo --dataset_name
... --reward_funcs ...`): the rewards the trainer logs are what the user's function returns,
held-out evaluation runs on eval_data, completions are written per round, names that do not
import are refused before any work."""

from __future__ import annotations

import json

import pytest

from _load import load_app, read_rows

REWARDS = '''
def has_target(completions, target, **kwargs):
    """0.25 for any completion, +0.5 when the target digit appears in it."""
    return [0.25 + 0.5 * (str(t) in c) for c, t in zip(completions, target)]
'''


@pytest.fixture(scope="module")
def app():
    return load_app("grpo")


def _files(tmp_path):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    rows = [{"question": f"Q: {a}+{b}=", "target": str((a + b) % 10)} for a in range(4) for b in range(4)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:4]) + "\n")
    return tmp_path / "train.jsonl", tmp_path / "test.jsonl", tmp_path / "my_rewards.py"


def test_user_data_and_reward_module_train_from_the_app(app, tmp_path, capsys):
    train, test, module = _files(tmp_path)
    out = tmp_path / "run"
    summary = app.main(["-cn", "tiny", f"out={out}", f"data={train}", f"eval_data={test}", "prompt_column=question",
                        f"reward={module}:has_target", "reward_weights=[2.0]", "steps=3", "eval_every=2",
                        "max_new_tokens=2"])
    lines = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert sorted({x["round"] for x in lines}) == [1, 2, 3] and len(lines) == 3 * 4 * 4  # rounds x prompts x group
    for x in lines:  # the trainer's reward is the user's function, weighted
        own = 0.25 + 0.5 * (_target(x["prompt"]) in x["completion"])
        assert x["rewards"] == [pytest.approx(own)] and x["reward"] == pytest.approx(2.0 * own)
    rows = read_rows(out / "metrics.csv")
    for r in (1, 2, 3):
        mean = sum(x["reward"] for x in lines if x["round"] == r) / 16
        assert float(rows[r - 1]["reward"]) == pytest.approx(mean, rel=1e-5)
    # held-out: the weighted reward of greedy completions at the start, round 2 and the end
    assert [s for s, _ in summary["heldout_accuracy_curve"]] == [0, 2, 3]
    assert all(0.5 <= v <= 1.5 for _, v in summary["heldout_accuracy_curve"])  # 2 x (0.25 .. 0.75)
    printed = capsys.readouterr().out  # stderr is not a terminal under pytest: a line per round
    assert "round 1/3 reward=" in printed and "round 2/3" in printed and "heldout=" in printed
    assert not (out / "sft").exists() or not (out / "sft" / "metrics.csv").exists()  # prompts only: no SFT


def _target(prompt: str) -> str:
    a, b = prompt[3:].rstrip("=").split("+")
    return str((int(a) + int(b)) % 10)


def test_reward_names_are_checked_before_any_work(app, tmp_path, monkeypatch):
    train, _, module = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg = app.main.load([f"data={train}", "reward=my_rewards:has_target"])  # a module beside the user
    assert cfg.reward_functions()[0].__name__ == "has_target"
    for bad, message in ((["reward=no_such_module:f"], "cannot import module 'no_such_module'"),
                         ([f"reward={module}:missing"], "has no attribute 'missing'.*has_target"),
                         (["reward=my_rewards"], "not a function name: name it as module:function"),
                         ([f"reward={module}:has_target", "reward_weights=[1,2]"], "2 weights for 1 reward"),
                         (["data=nowhere.jsonl"], "no such file"),
                         ([f"eval_data={train}"], "eval_data is for data=")):
        with pytest.raises(ValueError, match=message):
            app.main.load([f"data={train}", *bad] if not bad[0].startswith(("data=", "eval_data=")) else bad)
    with pytest.raises(SystemExit) as info:  # the command line: exit 2, nothing written
        app.main([f"out={tmp_path / 'x'}", f"data={train}", "reward=no_such_module:f"])
    assert info.value.code == 2 and not (tmp_path / "x").exists()
