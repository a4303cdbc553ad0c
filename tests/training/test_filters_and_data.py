"""Filters (DAPO dynamic sampling, overlong shaping in tokens) and the prompt pipeline."""

import numpy as np
import pytest

from jaxrl_llm.tasks.arithmetic import ArithmeticTask
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.tasks.pipeline import PromptPipeline, encode_prompts
from jaxrl_llm.training.score import choose_groups, informative_groups, overlong_keep
from jaxrl_llm.training.score import soft_overlong_penalty


def test_soft_overlong_penalty_is_linear_in_tokens():
  # max 10 tokens, buffer 4: free up to 6 tokens, then -1/4 per token down to -1 at 10.
  lengths = np.array([1, 6, 7, 8, 10])
  np.testing.assert_allclose(soft_overlong_penalty(lengths, 10, 4, 1.0), [0.0, 0.0, -0.25, -0.5, -1.0])
  np.testing.assert_allclose(soft_overlong_penalty(lengths, 10, 4, 0.5), [0.0, 0.0, -0.125, -0.25, -0.5])
  np.testing.assert_array_equal(soft_overlong_penalty(lengths, 10, 0, 1.0), np.zeros(5))


def test_dynamic_sampling_keeps_informative_groups_first():
  G = 3
  reward = np.array([1, 1, 1,  0, 1, 0,  0, 0, 0,  1, 0, 0,  0.5, 0.5, 0.5], np.float32)
  np.testing.assert_array_equal(informative_groups(reward, G), [False, True, False, True, False])
  rows, keep = choose_groups(reward, G, 3)
  # groups 1 and 3 are informative; the batch is topped up with group 0, masked out
  np.testing.assert_array_equal(rows, [3, 4, 5, 9, 10, 11, 0, 1, 2])
  np.testing.assert_array_equal(keep, [True] * 6 + [False] * 3)
  with pytest.raises(ValueError, match="only 5 groups sampled, 6 needed"):
    choose_groups(reward, G, 6)


def test_overlong_filter():
  trunc = np.array([True, False, True])
  np.testing.assert_array_equal(overlong_keep(trunc, True), [False, True, False])
  np.testing.assert_array_equal(overlong_keep(trunc, False), [True, True, True])


def test_prompts_left_padded_with_bos():
  tok = CharTokenizer()
  ex = ArithmeticTask(digits=2, digits2=1).examples("train", 2)
  pb = encode_prompts(tok, ex, 8)
  for b, e in enumerate(ex):
    n = len(e.prompt) + 1
    assert pb.mask_BP[b].tolist() == [False] * (8 - n) + [True] * n
    assert pb.tokens_BP[b, 8 - n] == tok.bos_id and tok.decode(pb.tokens_BP[b]) == e.prompt
  with pytest.raises(ValueError, match="max_prompt_len=4"):
    encode_prompts(tok, ex, 4)


@pytest.mark.slow
def test_pipeline_state_restores_the_prompt_stream():
  tok = CharTokenizer()
  ex = ArithmeticTask(digits=2).examples("train", 50)
  pipe = PromptPipeline(ex, tok, batch_size=8, max_prompt_len=8, seed=0)
  next(pipe), next(pipe)
  state = pipe.get_state()
  want = [next(pipe).prompts for _ in range(8)]  # crosses an epoch boundary (50 / 8)
  pipe2 = PromptPipeline(ex, tok, batch_size=8, max_prompt_len=8, seed=0)
  pipe2.set_state(state)
  assert [next(pipe2).prompts for _ in range(8)] == want
  # a different seed shuffles differently
  other = PromptPipeline(ex, tok, batch_size=8, max_prompt_len=8, seed=1)
  assert next(other).prompts != PromptPipeline(ex, tok, batch_size=8, max_prompt_len=8, seed=0).__next__().prompts
