"""The tiny built-in model variant that the tests train (a few seconds on 2 cores)."""

from catalog import builtin

TINY = builtin.TrainConfig(steps=300, d_model=32, n_heads=2, d_mlp=64, operand_hi=20,
                           batch_size=128, lr=1e-2, eval_prompts_per_op=200)
