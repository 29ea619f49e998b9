"""Environments (issue 42 item 4): the protocol (``reset`` / ``step`` / ``reward``) and TRL's kind
(``reset`` and public methods as tools) driven by the one multi-turn loop, per row, and through
``GRPOTrainer(environment_factory=...)`` with the reward reading the environments."""

from __future__ import annotations

import datasets
import pytest
import torch

from tdrl.llm import GRPOConfig, GRPOTrainer, make_tiny_lm
from tdrl.llm.agents import EnvironmentTool, GuessNumberEnv, Turn, environment_reward, start_environments, tool_rollout
from tdrl.llm.data import tokenize_prompts

from _scripted import ScriptedGenerator


class Counter:
    """TRL's kind of environment: ``reset`` and a public method that is a tool."""

    def reset(self, **row) -> str | None:
        self.count = int(row.get("start", 0))
        return f" start {self.count}\n"

    def increment(self, a: int) -> int:
        """Add to the counter.

        Args:
            a: how much.
        """
        self.count += a
        return self.count


@pytest.fixture(scope="module")
def env_lm(tmp_path_factory):
    corpus = ["guess 1 2 3 4 5 6 7 8 higher lower a number please", " start 0\n", "Q: count ",
              '<tool_call>{"name": "increment", "arguments": {"a": 2}}</tool_call><output>4</output> done',
              "Tools: increment(a: integer): Add to the counter. Call a tool as NAME {...}"]
    return make_tiny_lm(tmp_path_factory.mktemp("env_lm"), corpus, vocab_size=96, hidden_size=32, num_layers=1,
                        num_heads=2, num_kv_heads=1, intermediate_size=64, seed=0)


def test_guess_number_game_by_hand():
    env = GuessNumberEnv()
    assert env.reset(target=5, prompt="guess") is None
    assert env.step("3") == (" higher\n", False) and env.step("7") == (" lower\n", False)
    assert env.step("no idea") == (" a number please\n", False) and env.step("5") == (None, True)
    turns = [Turn("3", True), Turn(" higher\n", False), Turn("7", True), Turn(" lower\n", False), Turn("5", True)]
    assert env.reward(turns) == pytest.approx(1 / 3) and env.reward(turns[:3]) == 0.0
    assert env.reward([Turn("5", True)]) == 1.0


def test_environments_start_on_their_rows():
    envs, prompts = start_environments(Counter, ["Q: count ", [{"role": "user", "content": "count"}]],
                                       {"start": [3, 4]})
    assert [e.count for e in envs] == [3, 4]
    assert prompts == ["Q: count  start 3\n", [{"role": "user", "content": "count start 4\n"}]]
    with pytest.raises(TypeError, match="expected a string"):
        start_environments(lambda: type("E", (), {"reset": lambda self, **r: 1})(), ["x"], {})
    with pytest.raises(ValueError, match="no step"):
        EnvironmentTool(object())


def test_one_loop_drives_a_game_per_row(env_lm):
    """Two rows, two games (targets 5 and 2), driven by tool_rollout with one EnvironmentTool per row."""
    model, tok = env_lm
    prompts = ["guess ", "guess  "]
    script = {"guess  ": ["2"], "guess ": ["3", "7", "5"]}
    envs = []
    for target in (5, 2):
        envs.append(GuessNumberEnv())
        envs[-1].reset(target=target)
    ids, mask = tokenize_prompts(tok, prompts)
    res = tool_rollout(ScriptedGenerator(tok, script), tok, ids, mask, [EnvironmentTool(e) for e in envs], max_turns=4)
    assert [(t.text, t.from_policy) for t in res.turns[0]] == [
        ("3", True), (" higher\n", False), ("7", True), (" lower\n", False), ("5", True)]
    assert [(t.text, t.from_policy) for t in res.turns[1]] == [("2", True)]  # right at once: no reply, done
    assert environment_reward(res.final_turns, envs, res.turns) == [pytest.approx(1 / 3), 1.0]
    own = res.td["completion_mask"][0]
    replies = sum(len(tok(r, add_special_tokens=False)["input_ids"]) for r in (" higher\n", " lower\n"))
    assert int(own.sum()) == int(res.td["completion_attention_mask"][0].sum()) - replies  # replies are read, not trained
    with pytest.raises(ValueError, match="one per row"):
        tool_rollout(ScriptedGenerator(tok, script), tok, ids, mask, [EnvironmentTool(envs[0])], max_turns=2)


def test_grpo_trainer_takes_trls_environment_factory(env_lm):
    """TRL's spelling: GRPOTrainer(environment_factory=Counter); each completion gets its own
    environment reset on its row, the schema of its method is shown, the call runs on that
    environment, and the reward reads the environments (``environments=``)."""
    model, tok = env_lm
    torch.manual_seed(0)
    ds = datasets.Dataset.from_list([{"prompt": "Q: count ", "start": 2}, {"prompt": "Q: count ", "start": 5}])
    call = '<tool_call>{"name": "increment", "arguments": {"a": 2}}</tool_call>'
    prompt = "Tools:\nincrement(a: integer): Add to the counter.\n"  # the rendered prompt starts with the tools text
    gen = ScriptedGenerator(tok, {prompt: [call, " done"]})

    def counted(completions, environments, **kwargs):
        return [float(e.count) for e in environments]

    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=counted, environment_factory=Counter,
                          train_dataset=ds, generator=gen,
                          args=GRPOConfig(num_generations=2, generation_batch_size=4, max_steps=1, disable_tqdm=True,
                                          max_completion_length=40, max_turns=2))
    m = trainer.step()
    assert sorted(trainer.last_round["reward"]) == [4.0, 4.0, 7.0, 7.0]  # start + 2, each on its own environment
    assert m["tool_calls"] == 4 and m["tool_call_rate"] == 1.0
    assert all(c.startswith(call + "<output>") for c in trainer.last_conversations)
    with pytest.raises(ValueError, match="not both"):
        GRPOTrainer(model=model, processing_class=tok, environment_factory=Counter, train_dataset=ds,
                    args=GRPOConfig(tools=["python"]))


def test_evaluation_drives_the_environments_as_training_does(env_lm):
    """Held-out evaluation with ``environment_factory``: each row gets its own environment reset on
    it, the greedy conversation calls its method, and the reward reads the environments; the
    trainer's ``evaluate`` passes its environments (it used to score a single turn, without them)."""
    from tdrl.llm.trainers import evaluate

    model, tok = env_lm
    ds = datasets.Dataset.from_list([{"prompt": "Q: count ", "start": 2}, {"prompt": "Q: count ", "start": 5}])
    call = '<tool_call>{"name": "increment", "arguments": {"a": 2}}</tool_call>'
    gen = ScriptedGenerator(tok, {"Tools:\nincrement(a: integer): Add to the counter.\n": [call, " done"]})

    def counted(completions, environments, turns, **kwargs):
        assert [t.from_policy for t in turns[0]] == [True, False, True]  # call, its output, the last turn
        return [float(e.count) for e in environments]

    score = evaluate(model, tok, ds, counted, 40, generator=gen, environment_factory=Counter, max_turns=2,
                     reward_timeout=None)
    assert score == pytest.approx((4.0 + 7.0) / 2)  # start + 2, each on its own environment

    seen = []

    def starts(completions, environments, **kwargs):
        seen.extend(e.count for e in environments)
        return [float(e.count) for e in environments]

    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=starts, environment_factory=Counter,
                          train_dataset=ds, eval_dataset=ds,
                          args=GRPOConfig(num_generations=2, generation_batch_size=4, max_steps=1, disable_tqdm=True,
                                          max_completion_length=8, max_turns=2, reward_timeout=None))
    out = trainer.evaluate()
    assert len(seen) == 2 and seen[0] >= 2 and seen[1] >= 5  # each row's environment, reset on its row
    assert out == {"eval_starts": pytest.approx(sum(seen) / 2)}
