"""What TorchTitan's debug configuration reads that is not on PyPI, made in place of its own test
assets: used by tests/test_torchtitan.py and tools/bench_torchtitan.py."""
import json
import os
import random


def make_assets(where: str) -> None:
    """The tokenizer (`tests/assets/tokenizer`, Hugging Face's format with Llama 3's begin and end
    tokens) and the `c4_test` data set (`tests/assets/c4_test/data.json`, JSON lines of "text")
    TorchTitan's debug configuration reads, relative to its working directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    words = ("the device runs a program of ops over a mesh and every rank learns the small model while "
             "its loss falls step by step with gloo moving each shard").split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) + "." for _ in range(400)]
    os.makedirs(os.path.join(where, "tests/assets/c4_test"))
    with open(os.path.join(where, "tests/assets/c4_test/data.json"), "w") as f:
        f.writelines(json.dumps({"text": line}) + "\n" for line in lines)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(os.path.join(where, "tests/assets/tokenizer"))
    tokenizer.save(os.path.join(where, "tests/assets/tokenizer/tokenizer.json"))
    with open(os.path.join(where, "tests/assets/tokenizer/tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "add_bos_token": True,
                   "add_eos_token": True}, f)
