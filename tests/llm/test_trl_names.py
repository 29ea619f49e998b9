"""TRL's spellings through the one mapping, tdrl.llm.trl_names (issue 42, item 1): each TRL name
gives the same config as tdrl's name, TRL's string values mean what they mean in TRL, names tdrl
lacks are refused with what to use, and the README's table is the generated one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tdrl.llm import GRPOConfig, GRPOLossConfig, GRPOTrainer, SFTConfig, SFTTrainer, group_advantages
from tdrl.llm.trl_names import GRPO_CONFIG_NAMES, GRPO_TRAINER_NAMES, SFT_CONFIG_NAMES, SFT_TRAINER_NAMES, trl_table_markdown

README = Path(__file__).resolve().parents[2] / "packages" / "llm" / "README.md"


@pytest.mark.parametrize(("trl", "tdrl"), [
    (dict(num_generations=4), dict(group_size=4)),
    (dict(max_completion_length=16), dict(max_new_tokens=16)),
    (dict(learning_rate=1e-6), dict(lr=1e-6)),
    (dict(max_steps=7), dict(steps=7)),
    (dict(output_dir="out"), dict(log_dir="out")),
    (dict(logging_steps=5), dict(log_every=5)),
    (dict(save_steps=5), dict(checkpoint_every=5)),
    (dict(num_iterations=2), dict(epochs=2)),
    (dict(gradient_accumulation_steps=2), dict(grad_accum=2)),
    (dict(disable_tqdm=True), dict(progress=False)),
    (dict(beta=0.04), dict(loss=GRPOLossConfig(beta=0.04))),
    (dict(epsilon=0.1), dict(loss=GRPOLossConfig(eps_low=0.1, eps_high=0.1))),  # TRL: epsilon_high follows epsilon
    (dict(epsilon=0.1, epsilon_high=0.28), dict(loss=GRPOLossConfig(eps_low=0.1, eps_high=0.28))),
    (dict(loss_type="grpo"), dict(loss=GRPOLossConfig(reduction="sequence"))),
    (dict(loss_type="dapo"), dict(loss=GRPOLossConfig(reduction="token"))),
    (dict(loss_type="bnpo"), dict(loss=GRPOLossConfig(reduction="token", token_mean_over_ranks=False))),
    (dict(loss_type="dr_grpo", max_completion_length=24), dict(max_new_tokens=24, loss=GRPOLossConfig(reduction="constant", max_len=24))),
    (dict(scale_rewards=False), dict(loss=GRPOLossConfig(scale_rewards="none"))),
    (dict(importance_sampling_level="sequence"), dict(loss=GRPOLossConfig(sequence_level=True))),
    (dict(use_bias_correction_kl=True, beta=0.1), dict(loss=GRPOLossConfig(kl_bias_correction=True, beta=0.1))),
    # TRL counts completions per device and micro-step: 4 x 2 per optimiser step, 4 x 4 per generation
    (dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4, num_generations=4),
     dict(minibatch_size=8, grad_accum=2, prompts_per_step=4, group_size=4)),
    (dict(per_device_train_batch_size=8, num_generations=4), dict(minibatch_size=8, prompts_per_step=2, group_size=4)),
    (dict(generation_batch_size=32, num_generations=8), dict(prompts_per_step=4)),
    # TRL's max_steps counts optimiser steps: 2 iterations x (16 completions / 8 a step) = 4 a round
    (dict(max_steps=12, logging_steps=4, save_steps=8, num_iterations=2, per_device_train_batch_size=8,
          steps_per_generation=2, num_generations=4),
     dict(steps=3, log_every=1, checkpoint_every=2, epochs=2, minibatch_size=8, prompts_per_step=4, group_size=4)),
    (dict(use_vllm=False, report_to="none", bf16=False, log_completions=False), dict()),  # no effect here
    # TRL's IS correction: on with its defaults (cap 3, sequence_mask), or as given
    (dict(vllm_importance_sampling_correction=True), dict(loss=GRPOLossConfig(tis_cap=3.0, tis_mode="sequence_mask"))),
    (dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=2.0),
     dict(loss=GRPOLossConfig(tis_cap=2.0, tis_mode="token_truncate"))),
    (dict(vllm_importance_sampling_correction=False), dict()),
])
def test_grpo_trl_name_equals_tdrl_name(trl, tdrl):
    assert GRPOConfig(**trl) == GRPOConfig(**tdrl)


@pytest.mark.parametrize(("trl", "tdrl"), [
    (dict(max_steps=3, learning_rate=1e-4, output_dir="o", logging_steps=2), dict(steps=3, lr=1e-4, log_dir="o", log_every=2)),
    (dict(per_device_train_batch_size=4, gradient_accumulation_steps=2), dict(batch_size=8, grad_accum=2)),
    (dict(use_liger_kernel=False), dict(fused_logprobs=False)),
    (dict(packing=False, completion_only_loss=True, assistant_only_loss=True, max_length=None), dict()),
    (dict(packing=True, max_length=64, dataset_text_field="body", completion_only_loss=None),
     dict(packing=True, max_length=64, text_column="body", completion_only_loss=True)),
    (dict(completion_only_loss=False, assistant_only_loss=False), dict(completion_only_loss=False, assistant_only_loss=False)),
])
def test_sft_trl_name_equals_tdrl_name(trl, tdrl):
    assert SFTConfig(**trl) == SFTConfig(**tdrl)


def test_loss_strings_are_not_truthy_traps():
    # "none" once divided by the group std (a truthy string) and "batch" meant "group"
    rewards = torch.tensor([0.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 7.0])
    centred = [-1.0, 0.0, 0.0, 1.0, -1.0, -1.0, -1.0, 3.0]  # minus each group's mean (1 and 4)
    none = group_advantages(rewards, 4, GRPOLossConfig(scale_rewards="none").scale_rewards)
    assert none.tolist() == pytest.approx(centred)
    group_std = [(2 / 3) ** 0.5, (12 / 3) ** 0.5]  # unbiased std: squares 2 and 12 over n-1 = 3
    group = group_advantages(rewards, 4, GRPOLossConfig(scale_rewards="group").scale_rewards)
    assert group.tolist() == pytest.approx([c / (group_std[i // 4] + 1e-4) for i, c in enumerate(centred)])
    batch_std = float(torch.tensor([0.0, 1, 1, 2, 3, 3, 3, 7], dtype=torch.float64).std())  # over all 8 rewards
    batch = group_advantages(rewards, 4, GRPOLossConfig(scale_rewards="batch").scale_rewards)
    assert batch.tolist() == pytest.approx([c / (batch_std + 1e-4) for c in centred])
    assert GRPOLossConfig(scale_rewards=True).scale_rewards == "group"
    assert GRPOLossConfig.dr_grpo().scale_rewards == "none"


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(scale_rewards="off"), r"'group'.*'batch'.*'none'"),
    (dict(loss_type="cispo"), r"bnpo.*dapo.*dr_grpo.*grpo"),
    (dict(importance_sampling_level="seq"), r"sequence.*token"),
    (dict(loss="dappo"), r"grpo.*dapo.*dr_grpo.*gspo"),
    (dict(use_vllm=True), r"VLLMGenerator"),
    (dict(bf16=True), r"bfloat16"),
    (dict(report_to="wandb"), r"WandbLogger"),
    (dict(lr=1e-5, learning_rate=1e-6), r"given twice"),
    (dict(minibatch_size=8, per_device_train_batch_size=8), r"not both"),
    (dict(num_generations=3, per_device_train_batch_size=8), r"not divisible by num_generations=3"),
    (dict(vllm_importance_sampling_mode="tok"), r"sequence_mask.*token_mask"),
    (dict(max_steps=5, num_iterations=2), r"max_steps=5 .*rounds of 2 optimiser steps"),
    (dict(vllm_importance_sampling_correction=False, vllm_importance_sampling_cap=2.0), r"turns the correction off"),
])
def test_grpo_refuses_with_the_valid_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**kwargs)
    with pytest.raises(ValueError, match=r"'group'.*'batch'.*'none'"):
        GRPOLossConfig(scale_rewards="off")


def test_refused_names_say_what_to_use_and_unknown_names_get_close_matches():
    for table, cls in ((GRPO_CONFIG_NAMES, GRPOConfig), (SFT_CONFIG_NAMES, SFTConfig)):
        for row in table.names:
            if row.kind == "refuse":
                with pytest.raises(TypeError, match=rf"{row.trl}.*use "):
                    cls(**{row.trl: 1})
    with pytest.raises(TypeError, match="did you mean num_generations"):
        GRPOConfig(num_generation=4)
    with pytest.raises(ValueError, match="max_length=1: expected an integer >= 2"):
        SFTConfig(max_length=1)


def test_trainers_take_trls_keywords(tiny, task):
    folder, model, tok = tiny
    train, test = task.splits(16, 4)
    reward = lambda completions, answer, **kwargs: [float(c.strip() == a) for c, a in zip(completions, answer)]  # noqa: E731
    trainer = GRPOTrainer(model=str(folder), reward_funcs=reward, args=GRPOConfig(num_generations=2, max_steps=1,
                          max_completion_length=2, generation_batch_size=4, disable_tqdm=True),
                          train_dataset=train, eval_dataset=test, processing_class=tok)
    assert trainer.tokenizer is tok and trainer.reward_fns == [reward] and trainer.config.group_size == 2
    assert 0.0 <= trainer.evaluate()["eval_<lambda>"] <= 1.0
    with pytest.raises(TypeError, match="callback="):
        GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(), train_dataset=train, processing_class=tok,
                    callbacks=[])
    with pytest.raises(ValueError, match="not a local folder"):
        GRPOTrainer(model=model, reward_funcs="some/reward-model", train_dataset=train, processing_class=tok)
    with pytest.raises(TypeError, match="second positional argument is the tokenizer"):
        GRPOTrainer(model, reward, GRPOConfig(), train)  # TRL's positional order (model, reward_funcs, args, ...)
    with pytest.raises(ValueError, match="2 reward functions but 1 reward_weights"):
        GRPOTrainer(model="no/such/model", reward_funcs=[reward, reward], args=GRPOConfig(reward_weights=[1.0]),
                    train_dataset=train)  # refused before any model is loaded
    sft = SFTTrainer(model=model, args=SFTConfig(max_steps=1, per_device_train_batch_size=8, disable_tqdm=True),
                     train_dataset=train, eval_dataset=test, processing_class=tok)
    before = sft.evaluate()["eval_loss"]
    assert before > 0 and sft.train()[-1]["loss"] > 0


def test_readme_table_is_the_generated_one():
    text = README.read_text()
    found = re.search(r"<!-- trl-names:begin -->\n(.*?)<!-- trl-names:end -->", text, re.S)
    assert found, "packages/llm/README.md lacks the trl-names markers"
    assert found.group(1) == trl_table_markdown(), "regenerate with tdrl.llm.trl_names.write_readme_table('packages/llm/README.md')"
    for table in (GRPO_CONFIG_NAMES, GRPO_TRAINER_NAMES, SFT_CONFIG_NAMES, SFT_TRAINER_NAMES):
        for row in table.names:
            assert f"| `{row.trl}` |" in found.group(1)


def test_peft_config_wraps_the_model(tiny, task):
    peft = pytest.importorskip("peft")
    folder, model, tok = tiny
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=SFTConfig(max_steps=1, per_device_train_batch_size=8, disable_tqdm=True),
                         train_dataset=task.splits(16, 4)[0], processing_class=tok, peft_config=config)
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable), "only the adapters train, as with TRL's peft_config"
