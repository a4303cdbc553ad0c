"""The teacher: build it, score the student's rollouts with it, and route its
signal into the update (docs/objectives.md section 11: on-policy
distillation, self-distillation with hints, SRPO, RLSD, the trust knobs).

Where the teacher comes from (``teacher.source``):

* ``sft``: an external teacher made by the warm start: the warm-started
  student trained ``sft_steps`` more steps on *correct* demonstrations only
  (a better-trained checkpoint of the same architecture and tokenizer).
* ``checkpoint``: an external teacher from a Hugging Face directory or a
  run's workdir; its vocabulary must be the student's.
* ``self``: the student's own network (SDPO). Its weights follow
  ``teacher.schedule`` (objectives/teacher_schedule.py). With
  ``context=hint`` the teacher sees the reference answer as a hint before the
  prompt; ``hint_sft_steps`` warm-start steps teach the model to read a hint.

How the signal enters (``teacher.signal``), all on the student's own samples:

* ``distill``: the loss form, coef * D(p, q) per token (reverse KL, forward
  KL or JSD(beta), docs/objectives.md eqs. 11.2-11.5; over the full vocabulary, or over the teacher's
  top-k with ``teacher.topk``), plus rl_coef times the reward policy loss.
* ``gap_advantage``: the sampled-token advantage form: A_t = rl_coef A_i +
  coef tau_t Delta_t with Delta the detached teacher gap (eqs. 11.7, 11.9).
* ``srpo``: GRPO on samples routed z_grpo, coef * D on samples routed z_sdpo
  (eqs. 11.10-11.11), one shared token normaliser.
* ``rlsd``: reward sets the direction, the clipped teacher gap the magnitude
  (eqs. 11.13-11.14).

tau is the teacher-confidence weight of eq. 11.17 (confidence_beta = 0: tau = 1);
``sign_gate`` multiplies the teacher branch by the SG-OPD sign-consistency gate
(eq. 11.18, objectives/teacher.py). With ``route_by_tag`` each task tag has its own
external teacher (multi-teacher distillation, section 11.2); a sample whose tag
has none gets m_i = 0 (no teacher term; SRPO routes it to GRPO).

This module builds the teacher's weights; the config is config.py, the
scoring and rewriting stage.py, the loss term loss.py, and extension.py hooks
all of it into the RL loop through the extension protocol
(jaxrl_llm/extension.py).

Checkpoints: a self-teacher under ``refresh`` / ``ema`` depends on the run's
history, so its weights are saved with every checkpoint of the run and
restored on resume (``TeacherExtension.checkpoint_trees``). Every other teacher is
rebuilt deterministically on resume (the warm start reruns, external
checkpoints are read again, ``frozen`` is theta_0, ``current`` is the
student) and stays out of the checkpoint.
"""

from jaxrl_llm.teacher.build import build_teacher, load_teacher_checkpoint
from jaxrl_llm.teacher.config import CONTEXTS, DIVERGENCES, SIGNALS, SOURCES, TeacherConfig, teacher_preflight
from jaxrl_llm.teacher.extension import TeacherExtension
from jaxrl_llm.teacher.loss import DistillTerm
from jaxrl_llm.teacher.stage import TeacherSignals, TeacherStage, hint_examples

__all__ = [
  "CONTEXTS",
  "DIVERGENCES",
  "SIGNALS",
  "SOURCES",
  "DistillTerm",
  "TeacherConfig",
  "TeacherExtension",
  "TeacherSignals",
  "TeacherStage",
  "build_teacher",
  "hint_examples",
  "load_teacher_checkpoint",
  "teacher_preflight",
]
