"""Request features: tokenizer and chat template, SGLang page hashes, turn and est_hit."""
