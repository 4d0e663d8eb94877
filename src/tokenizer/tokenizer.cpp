// tokenizer module
