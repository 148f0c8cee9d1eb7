"""transformers BertEmbeddings: `self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)` in BertModel -
word, token-type and position embeddings (positions from its registered position_ids buffer) summed, LayerNorm
(eps 1e-12), dropout (identity in eval). BERT-base: vocabulary 30522, 768 features, 32 sequences of 512 tokens."""
import os

import torch
import torch.nn as nn
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertEmbeddings

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN, VOCAB = (2, 8, 32, 301) if SMALL else (32, 512, 768, 30522)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=4 if SMALL else 12,
                            max_position_embeddings=512)
        self.embeddings = BertEmbeddings(config)
        with torch.no_grad():
            self.embeddings.LayerNorm.weight.normal_(1.0, 0.1)
            self.embeddings.LayerNorm.bias.normal_(0.0, 0.1)
        self.to(DTYPE)

    def forward(self, input_ids, token_type_ids):
        return self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)


def get_inputs():
    token_type_ids = (torch.arange(T)[None, :] >= torch.randint(1, T, (B, 1))).long()  # sentence A, then sentence B
    return [torch.randint(0, VOCAB, (B, T)), token_type_ids]


def get_init_inputs():
    return []
