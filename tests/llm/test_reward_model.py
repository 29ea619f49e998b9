"""A reward model in the reward list (issue 42): a real sequence-classification model built from
the tiny model's config and saved to a folder scores prompt + completion with its own logits, in
``GRPOTrainer(reward_funcs=[folder])``, in ``load_reward`` (the app's ``reward=``), batched."""

from __future__ import annotations

import copy

import pytest
import torch

from tdrl.llm import GRPOConfig, GRPOTrainer
from tdrl.llm.rewards import RewardModel, load_reward


@pytest.fixture(scope="module")
def rm_folder(_tiny, tmp_path_factory):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    folder, _, tok = _tiny
    cfg = AutoConfig.from_pretrained(folder)
    cfg.num_labels = 1
    torch.manual_seed(1)
    rm = AutoModelForSequenceClassification.from_config(cfg)
    out = tmp_path_factory.mktemp("reward_model")
    rm.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _own_logits(folder, texts):
    """The model's own logits, one text at a time (no padding involved)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model, tok = AutoModelForSequenceClassification.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return [model(**tok(t, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item() for t in texts]


def test_scores_are_the_models_own_logits(rm_folder):
    rm = load_reward(str(rm_folder))
    assert isinstance(rm, RewardModel) and rm.reward_in_thread
    prompts, completions = ["Q: 1+2=", "Q: 3+4=", "Q: 9+9="], ["3", "12", "18 "]
    rm.batch_size = 2  # two batches, the first padded
    scores = rm(prompts, completions)
    expected = _own_logits(rm_folder, [p + c for p, c in zip(prompts, completions)])
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(round(s, 6) for s in scores)) == 3  # the texts score differently


def test_chat_prompts_go_through_the_chat_template(rm_folder):
    rm = RewardModel(str(rm_folder))
    rm.tokenizer = copy.deepcopy(rm.tokenizer)
    rm.tokenizer.chat_template = "{% for m in messages %}{{ m['role'][0] }}: {{ m['content'] }}\n{% endfor %}"
    prompt = [{"role": "user", "content": "1+2="}]
    assert rm.texts([prompt], [[{"role": "assistant", "content": "3"}]]) == ["u: 1+2=\na: 3\n"]
    assert rm([prompt], ["3"]) == pytest.approx(_own_logits(rm_folder, ["u: 1+2=\na: 3\n"]), abs=1e-5)


def test_a_folder_that_is_not_a_reward_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_reward(str(tmp_path))


def test_grpo_trainer_scores_with_a_reward_model_folder(tiny, task, rm_folder):
    """The issue's bug: a reward model in the reward list failed at the first batch. Here a round
    runs, on the trainer's device, and each completion's reward is the model's logit on its text."""
    _, model, tok = tiny
    train, _ = task.splits(8, 2)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[str(rm_folder)], train_dataset=train,
                          args=GRPOConfig(num_generations=2, generation_batch_size=4, max_steps=1,
                                          max_completion_length=3, disable_tqdm=True))
    (rm,) = trainer.reward_fns
    assert isinstance(rm, RewardModel) and next(rm.model.parameters()).device == trainer.device
    trainer.step()
    r = trainer.last_round
    texts = [p + c for p, c in zip(r["prompt"], r["completion"])]
    assert r["reward"] == pytest.approx(_own_logits(rm_folder, texts), abs=1e-5)


def test_the_apps_reward_names_a_reward_model_folder(rm_folder, tmp_path):
    """``apps/grpo/train.py data=... reward=<folder>``: the folder is a reward model, checked
    before any work (a folder that is not one is refused there)."""
    import json

    from _load import load_app

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q: {i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    app = load_app("grpo")
    cfg = app.main.load([f"data={data}", f"reward={rm_folder}"])
    (rm,) = cfg.reward_functions()
    assert isinstance(rm, RewardModel) and rm(["Q: 1+2="], ["3"]) == pytest.approx(_own_logits(rm_folder, ["Q: 1+2=3"]), abs=1e-5)
    with pytest.raises(ValueError, match="no config.json"):
        app.main.load([f"data={data}", f"reward={tmp_path}"])
