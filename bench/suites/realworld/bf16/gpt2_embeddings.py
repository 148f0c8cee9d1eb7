"""transformers GPT2Model's input embeddings: `inputs_embeds = self.wte(input_ids); position_embeds =
self.wpe(position_ids); hidden_states = inputs_embeds + position_embeds; hidden_states = self.drop(hidden_states)`,
position ids built in forward from arange, with the model's own wte (50257 x 768), wpe (1024 x 768) and dropout
(identity in eval). GPT-2 small: 8 sequences of 1024 tokens."""
import os

import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2Model

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN, VOCAB, MAX_POS = (2, 8, 32, 503, 16) if SMALL else (8, 1024, 768, 50257, 1024)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = GPT2Config(vocab_size=VOCAB, n_positions=MAX_POS, n_embd=HIDDEN, n_layer=0, n_head=4 if SMALL else 12,
                            bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
        transformer = GPT2Model(config)
        self.wte, self.wpe, self.drop = transformer.wte, transformer.wpe, transformer.drop
        self.to(DTYPE)

    def forward(self, input_ids):
        position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device).unsqueeze(0)
        inputs_embeds = self.wte(input_ids)
        position_embeds = self.wpe(position_ids)
        hidden_states = inputs_embeds + position_embeds
        hidden_states = self.drop(hidden_states)
        return hidden_states


def get_inputs():
    return [torch.randint(0, VOCAB, (B, T))]


def get_init_inputs():
    return []
