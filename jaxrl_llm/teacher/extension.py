"""The teacher as an extension of the RL loop (jaxrl_llm/extension.py).

    preflight      teacher paths, vocabularies and top-k, before the workdir
    setup          builds the teacher (build.py) after the warm start; a
                   self-teacher's hint warm start replaces the student's params
    rewrite_batch  scores the step's samples (stage.py) and rewrites the
                   advantages; the loss forms' inputs go into extra_BR
    token_diagnostics  that batch's per-token signals and gates (the dump)
    extra_terms    the loss forms' divergence term (loss.py)
    aux            the teacher heads the loss forms need in the update
    checkpoint_trees  a moving self-teacher's weights
"""

from __future__ import annotations


from jaxrl_llm.checkpointing.run import ExtraTree
from jaxrl_llm.extension import Extension, SetupEnv
from jaxrl_llm.tasks.pipeline import prompt_text
from jaxrl_llm.teacher.build import build_teacher
from jaxrl_llm.teacher.config import TeacherConfig, teacher_preflight
from jaxrl_llm.teacher.stage import TeacherStage

CHECKPOINT_KEY = "teacher_params"  # the moving self-teacher's weights in the run's checkpoints


class TeacherExtension(Extension):
  """On-policy distillation, SDPO, SRPO and RLSD (teacher/__init__.py)."""

  name = "teacher"
  rebuild_from_warm_start = True  # sft / self teachers start from the warm-started student

  def __init__(self, cfg: TeacherConfig):
    self.cfg = cfg
    self.stage: TeacherStage | None = None
    self.info: dict = {}
    self._aggregation = "token_mean"

  def preflight(self, run_cfg) -> None:
    teacher_preflight(run_cfg)

  def setup(self, env: SetupEnv, params):
    c, cfg = env.run_cfg, self.cfg
    self.preflight(c)  # paths, vocabulary, topk: before any teacher is built

    def sft_fn(p, examples, steps):
      longest = 1 + max(len(env.tokenizer.encode(prompt_text(env.tokenizer, e.prompt, c.data.chat_template)))
                        for e in examples)  # + BOS; hinted prompts are longer than data.max_prompt_len
      label = ("teacher warm start (hint reading)" if cfg.source == "self"
               else "teacher warm start (SFT on correct demonstrations)")
      return env.sft(p, examples, steps, max_prompt_len=max(c.data.max_prompt_len, -(-longest // 8) * 8),
                     label=label)

    params, t_params, t_cfg, info = build_teacher(cfg, params, env.model_cfg, sft_fn=sft_fn,
                                                  train_examples=env.train_examples)
    env.log(f"teacher: {info.get('teacher_source')}, signal {cfg.signal}")
    self.info = info
    self._aggregation = c.objective.aggregation
    self.stage = TeacherStage(cfg, t_params, t_cfg, env.model_cfg, env.tokenizer, temperature=c.rollout.temperature,
                              max_prompt_len=c.data.max_prompt_len, chat_template=c.data.chat_template,
                              chunk=c.micro_batch_size, impl=c.kernels.impl, tag_teacher=info.get("tag_teacher"))
    return params

  def extra_terms(self) -> tuple:
    return self.stage.extra_terms(self._aggregation)

  def aux(self, state) -> dict:
    if self.cfg.loss_form and not self.cfg.topk:  # the loss forms over the full vocabulary
      return self.stage.heads(state)
    return {}

  def rewrite_batch(self, state, samples, scores, adv_BR, mask_BR):
    sig = self.stage.signals(samples, state.params, int(state.step))
    return self.stage.apply(sig, adv_BR, mask_BR, scores.correct_B)

  def token_diagnostics(self) -> dict:
    """The teacher's signals, trust weights and gates of the last batch (`TeacherStage.diagnostics`)."""
    return dict(self.stage.diagnostics) if self.stage is not None else {}

  def checkpoint_trees(self) -> dict:
    if not self.cfg.moving_self_teacher:
      return {}
    return {CHECKPOINT_KEY: ExtraTree(get=lambda: self.stage.params, set=self.stage.restore_params)}

  def summary(self) -> dict:
    return {"teacher_source": str(self.info.get("teacher_source", "")), "teacher_signal": self.cfg.signal}
