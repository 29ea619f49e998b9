"""A generator that writes scripted turns (shared by the multi-turn tests)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from tdrl.llm import keys as K
from tdrl.llm.generation import Generator


class ScriptedGenerator(Generator):
    """Writes the next scripted turn of each conversation (found by its prompt text), with fixed
    log-probs: the loop and the layout are then known exactly."""

    def __init__(self, tok, script: dict[str, list[str]]):
        self.tok, self.script, self.calls = tok, script, []

    def generate(self, prompt_ids, prompt_mask, greedy=False):
        rows, lps = [], []
        for ids, m in zip(prompt_ids, prompt_mask):
            ctx = self.tok.decode(ids[m.bool()].tolist(), skip_special_tokens=False)
            prompt = next(p for p in self.script if ctx.startswith(p))
            k = ctx.count(self.tok.eos_token)  # the turns written so far each end with EOS
            t = self.tok(self.script[prompt][k], add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            rows.append(t)
            lps.append([-0.1 * (j + 1) for j in range(len(t))])
        self.calls.append(len(rows))
        C = max(map(len, rows))
        ids = torch.full((len(rows), C), self.tok.pad_token_id)
        mask = torch.zeros(len(rows), C, dtype=torch.bool)
        lp = torch.zeros(len(rows), C)
        for i, (r, lq) in enumerate(zip(rows, lps)):
            ids[i, : len(r)], mask[i, : len(r)], lp[i, : len(r)] = torch.tensor(r), True, torch.tensor(lq)
        return TensorDict({K.COMPLETION_IDS: ids, K.COMPLETION_MASK: mask, K.SAMPLE_LOG_PROB: lp}, batch_size=[len(rows)])
