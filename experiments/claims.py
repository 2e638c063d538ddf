"""The paper claims `experiments/reproduce.py` runs at laptop scale.

One `Claim` per method: the experiment variants to compare (module name +
Config overrides), the per-step metric that carries the claim, and the
outcome that would reproduce it. Add an entry when you add a method.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Claim:
  """A paper's central claim as a comparison of laptop-scale runs.

  Attributes:
    claim: what the paper claims, with its figure / table.
    variants: label -> (experiment module name, Config overrides). Labels
      name directories: letters, digits, '_', '.', '-'.
    metric: the per-step metrics.jsonl key that carries the claim.
    expected: the outcome that reproduces the claim, in words.
    extra: more per-step keys shown in the table and plot.
    evals: held-out keys of eval_before.json / eval_after.json shown
      before and after RL beside the greedy accuracy (e.g. eval/pass@16,
      which needs --eval_samples >= 16 in the variants).
    base: label -> Config overrides that replace the variant's on the
      shipped-base testbed (reproduce.py --testbed=base), where a value
      chosen for the tiny testbed does not carry over (a token budget,
      the mixture a control arm shares with its experiment's BASE).
    testbeds: where the claim runs: ("tiny",) where its experiments need
      a task, format or warm start of their own that the shipped base,
      pretrained on addsub5 alone, never saw (knowledge-base search, tool
      calls, tags, knights-and-knaves).
  """

  claim: str
  variants: dict[str, tuple[str, dict]]
  metric: str
  expected: str
  extra: tuple[str, ...] = ()
  evals: tuple[str, ...] = ()
  base: dict[str, dict] = dataclasses.field(default_factory=dict)
  testbeds: tuple[str, ...] = ("base", "tiny")

  def check_testbed(self, testbed: str) -> None:
    """Raises ValueError for a testbed the claim does not run on."""
    if testbed not in self.testbeds:
      raise ValueError(
        f"--testbed={testbed}: this claim runs only on "
        f"--testbed={' or '.join(self.testbeds)} (its experiments need a "
        "task or warm start of their own that the shipped base, pretrained "
        "on addsub5 alone, never saw; experiments/claims.py)"
      )

  def overrides(self, label: str, testbed: str) -> tuple[str, dict]:
    """(module name, Config overrides) of a variant on a testbed (one it
    runs on: check_testbed)."""
    self.check_testbed(testbed)
    module_name, overrides = self.variants[label]
    if testbed == "base" and label in self.base:
      overrides = self.base[label]
    return module_name, overrides


# The mixture the curriculum claims (adacl, dump) draw from on the shipped
# base: the three addsub5 levels it was pretrained on (its card: pass@1
# 59 / 33 / 20%), one source per level: their experiments' BASE dicts and
# their uniform arms' base overrides (tests/reproduce_test.py checks the
# arms of a claim draw from the same data). 300 train prompts a level
# (level 1 has 301 distinct ones) and 34 held-out (all of level 1's).
BASE_MIXTURE = dict(
  data="task:addsub5:difficulty=1-3,n=900",
  eval_data="task:addsub5:difficulty=1-3,n=102,split=eval",
  eval_size=102,
)

# The hard-problem claims' data on the shipped base (entropy_advantage,
# pope, seele, ampo: their experiments' BASE dicts): level-3 addsub5_order,
# where the base's pass@16 is 84% and its pass@1 14% (its card), so all-wrong
# groups, which these methods act on, stay common; at the main job's level 2
# (pass@16 98%) hints and prefixes reach few groups (ghpo's and guide's base
# rows).
BASE_LEVEL3 = dict(data="task:addsub5_order:difficulty=3,n=1000")

# The teacher of the distillation claims (kdrl, ampo: their experiments'
# BASE dicts) on the shipped base: the base after 200 SFT steps on exact
# solutions of the run's data (their --teacher=warm_start). Without them
# the teacher would be the base itself, the student's own start
# (teacher.check refuses that). Measured (seed 0's, `experiments.evaluate`):
# 97.9% greedy on the 140 held-out level-2 addsub5_order problems, where
# the base has 1.4%.
BASE_TEACHER = dict(teacher_steps=200)

CLAIMS: dict[str, Claim] = {
  "dr_grpo": Claim(
    claim=(
      "GRPO's 1/|o_i| normaliser and std scaling make incorrect responses "
      "grow longer; Dr. GRPO stops that growth (arXiv:2503.20783, Fig. 1 "
      "right). Both variants without KL, as the paper (--beta 0)."
    ),
    variants={
      "grpo": ("grpo", {"kl_coef": 0.0}),
      "dr_grpo": ("dr_grpo", {}),
    },
    metric="length/incorrect",
    expected=(
      "dr_grpo's incorrect-response length grows less (delta) and ends at "
      "or below grpo's"
    ),
    extra=("length/correct", "accuracy"),
  ),
  "dapo": Claim(
    claim=(
      "Clip-higher (epsilon_high 0.28 > epsilon_low 0.2) keeps the policy's "
      "entropy from collapsing (arXiv:2503.14476, Fig. 2b); everything else "
      "is DAPO in both variants."
    ),
    variants={
      "clip_0.2_0.2": ("dapo", {"clip_eps_high": 0.2}),
      "clip_0.2_0.28": ("dapo", {}),
    },
    metric="entropy",
    expected="clip_0.2_0.28 ends with higher entropy than clip_0.2_0.2",
    extra=("accuracy", "clipfrac"),
  ),
  "rloo": Claim(
    claim=(
      "REINFORCE with a leave-one-out baseline matches or beats RAFT "
      "(fine-tuning on the verified samples) and PPO-style clipped "
      "objectives (arXiv:2402.14740)."
    ),
    variants={
      "rloo": ("rloo", {}),
      "expert_iteration": ("expert_iteration", {}),
      "grpo": ("grpo", {}),
    },
    metric="accuracy",
    expected="rloo's accuracy at least expert_iteration's",
    extra=("length",),
  ),
  "reinforce_pp": Claim(
    claim=(
      "Global advantage normalisation (REINFORCE++, and its group-baseline "
      "variant) trains at least as well as GRPO's per-prompt normalisation "
      "(arXiv:2501.03262)."
    ),
    variants={
      "reinforce_pp": ("reinforce_pp", {}),
      "reinforce_pp_baseline": (
        "reinforce_pp",
        {"advantage": "reinforce_plus_plus_baseline"},
      ),
      "grpo": ("grpo", {}),
    },
    metric="accuracy",
    expected="both REINFORCE++ variants at least grpo's accuracy",
    extra=("entropy", "length"),
  ),
  "gspo": Claim(
    claim=(
      "GSPO clips about two orders of magnitude more tokens than GRPO yet "
      "learns at least as efficiently (arXiv:2507.18071, Sec. 5); GRPO "
      "with the paper's 0.2 / 0.27 clip and the same 4 minibatches."
    ),
    variants={
      "grpo": (
        "grpo",
        {"minibatches": 4, "kl_coef": 0.0, "clip_eps_high": 0.27},
      ),
      "gspo": ("gspo", {}),
    },
    metric="clipfrac",
    expected="gspo's clipfrac far above grpo's; its accuracy not lower",
    extra=("accuracy", "entropy"),
  ),
  "expert_iteration": Claim(
    claim=(
      "Expert iteration (SFT on verified self-samples) is competitive with "
      "RL from the same verifier (arXiv:2403.04642)."
    ),
    variants={
      "expert_iteration": ("expert_iteration", {}),
      "grpo": ("grpo", {}),
    },
    metric="accuracy",
    expected="expert_iteration's accuracy close to grpo's",
    extra=("length",),
  ),
  "forking_tokens": Claim(
    claim=(
      "Policy gradients through the top-20% entropy tokens alone match or "
      "beat the full gradient; the bottom 80% alone is clearly worse "
      "(arXiv:2506.01939, abstract); DAPO's loss in all three."
    ),
    variants={
      "top20": ("forking_tokens", {}),
      "full": ("forking_tokens", {"token_selection": "all"}),
      "bottom80": ("forking_tokens", {"token_selection": "bottom"}),
    },
    metric="accuracy",
    expected="top20's accuracy >= full's; bottom80's the lowest",
    extra=("entropy",),
  ),
  "entropy_mechanism": Claim(
    claim=(
      "Restricting the update of high-covariance tokens (Clip-Cov, KL-Cov) "
      "keeps the policy entropy from collapsing as it does under GRPO "
      "(arXiv:2505.22617, Sec. 4-5); no KL term in all three."
    ),
    variants={
      "grpo": ("entropy_mechanism", {"policy_loss": "ppo"}),
      "clip_cov": ("entropy_mechanism", {"policy_loss": "clip_cov"}),
      "kl_cov": ("entropy_mechanism", {}),
    },
    metric="entropy",
    expected="clip_cov and kl_cov end with higher entropy than grpo",
    extra=("accuracy",),
  ),
  "tricks_or_traps": Claim(
    claim=(
      "Lite PPO (group-mean / batch-std advantages + token-level loss) "
      "beats GRPO's group normalisation with sequence-level loss "
      "(arXiv:2508.08221); both critic-free, vanilla PPO loss, no KL."
    ),
    variants={
      "lite_ppo": ("tricks_or_traps", {}),
      "group_seq": (
        "tricks_or_traps",
        {"adv_norm": "group", "aggregation": "seq-mean-token-mean"},
      ),
    },
    metric="accuracy",
    expected="lite_ppo's accuracy >= group_seq's",
    extra=("entropy", "length"),
  ),
  "entropy_advantage": Claim(
    claim=(
      "An entropy term in the advantage improves pass@k, more so at "
      "large k (arXiv:2506.14758); alpha = 0 is plain GRPO. pass@16 of "
      "the final policy is in each run's eval_after.json."
    ),
    variants={
      "entropy_adv": ("entropy_advantage", {}),
      "grpo": ("entropy_advantage", {"adv_entropy_alpha": 0.0}),
    },
    metric="accuracy",
    expected=(
      "entropy_adv's eval/pass@16 above grpo's, train accuracy about equal"
    ),
    extra=("entropy", "adv_entropy_term"),
    evals=("eval/pass@16",),
  ),
  "ppo": Claim(
    claim=(
      "PPO with a learned critic and GAE (gamma = lambda = 1, no KL) "
      "trains a reasoning policy from a verifier (arXiv:2503.24290); "
      "GRPO for reference."
    ),
    variants={
      "ppo": ("ppo", {}),
      "grpo": ("grpo", {}),
      # ORZ's update schedule: 1 policy and 12 critic updates a rollout
      "orz_updates": ("ppo", {"minibatches": 1, "critic_minibatches": 12}),
    },
    metric="accuracy",
    expected="ppo's accuracy rises, comparable to grpo's",
    extra=("value/explained_var", "entropy"),
  ),
  "truncated_ppo": Claim(
    claim=(
      "PPO updates on truncated responses with Extended GAE learn as well "
      "as PPO on complete ones (arXiv:2506.15050)."
    ),
    variants={
      "truncated_ppo": ("truncated_ppo", {}),
      "ppo": ("ppo", {}),
      # Diagnostic, not the paper's recipe: 30 critic-only steps first.
      "critic_warmup": ("truncated_ppo", {"critic_warmup": 30}),
    },
    metric="accuracy",
    expected="truncated_ppo's accuracy comparable to ppo's",
    extra=("value/explained_var", "entropy"),
  ),
  "siren": Claim(
    claim=(
      "Self-anchored, selective entropy regularisation keeps the entropy "
      "near its starting level, where a plain bonus drifts and no "
      "regulariser collapses (arXiv:2509.25133)."
    ),
    variants={
      "siren": ("siren", {}),
      "no_anchor": ("siren", {"self_anchored": False}),
      "none": ("siren", {"siren_coef": 0.0}),
    },
    metric="entropy",
    expected="siren's entropy delta closest to 0; accuracy not lower",
    extra=("accuracy", "siren/h_bar"),
  ),
  "lp_reg": Claim(
    claim=(
      "Shielding low-probability tokens of negative samples with a KL to "
      "a min-p proxy sustains entropy in on-policy training "
      "(arXiv:2510.03222); lp_coef = 0 is the same loss without it."
    ),
    variants={
      "lp_reg": ("lp_reg", {}),
      "baseline": ("lp_reg", {"lp_coef": 0.0}),
    },
    metric="entropy",
    expected="lp_reg's entropy decays less than baseline's",
    extra=("accuracy", "lp_reg_frac"),
  ),
  # Issue 9: reward design, label-free RL and length control.
  "ttrl": Claim(
    claim=(
      "Majority-vote pseudo-labels on unlabeled test prompts improve pass@1 "
      "toward RL with the true labels, beyond the initial majority vote "
      "(arXiv:2504.16084, Table 1); gold_labels trains on the true rewards."
    ),
    variants={
      "ttrl": ("ttrl", {}),
      "gold_labels": ("ttrl", {"label_source": "gold"}),
    },
    metric="accuracy",
    expected=(
      "ttrl's accuracy grows (delta > 0) toward gold_labels' and ends above "
      "its starting ttrl/label_accuracy (maj@G)"
    ),
    extra=("ttrl/label_accuracy", "ttrl/reward_accuracy"),
  ),
  "rent": Claim(
    claim=(
      "Minimising the entropy of the responses' tokens, with no labels, "
      "improves accuracy (arXiv:2505.22660); grpo uses the verifier."
    ),
    variants={"rent": ("rent", {}), "grpo": ("grpo", {})},
    metric="accuracy",
    expected="rent's held-out accuracy above its start and near grpo's",
    extra=("entropy", "reward"),
  ),
  "confclip": Claim(
    claim=(
      "Weighting the verifiable reward by the policy's clipped confidence "
      "gives a finer-grained signal than 0/1 and a gradient on solved "
      "groups, raising accuracy and shortening completions "
      "(arXiv:2509.17730; the reward's form is ours, see confclip.py)."
    ),
    variants={"confclip": ("confclip", {}), "grpo": ("grpo", {})},
    metric="accuracy",
    expected="confclip's held-out accuracy at least grpo's, length lower",
    extra=("length", "confidence", "solved_all"),
  ),
  "format_length": Claim(
    claim=(
      "Format and length surrogate rewards, with no ground truth, train as "
      "well as the correctness reward (arXiv:2505.19439); all three on the "
      "tagged arithmetic task."
    ),
    variants={
      "correctness": ("format_length", {"reward_mode": "correctness"}),
      "format_only": ("format_length", {"length_weight": 0.0}),
      "format_length": ("format_length", {}),
    },
    metric="accuracy",
    expected=(
      "format_length's accuracy close to correctness' and at least "
      "format_only's"
    ),
    extra=("length", "reward"),
    testbeds=("tiny",),
  ),
  "logic_rl": Claim(
    claim=(
      "On the same knights-and-knaves puzzles, a difficulty curriculum "
      "beats a random shuffle (arXiv:2502.14768, curriculum ablation)."
    ),
    variants={
      "curriculum": ("logic_rl", {}),
      "shuffled": ("logic_rl", {"curriculum": ""}),
    },
    metric="accuracy",
    expected="curriculum's accuracy and held-out accuracy at least shuffled's",
    extra=("reward/format", "length"),
    testbeds=("tiny",),
  ),
  "dler": Claim(
    claim=(
      "A plain truncation penalty with batch-normalised advantages, "
      "clip-higher and dynamic sampling cuts length while keeping accuracy "
      "(arXiv:2510.15110); no_limit is the same recipe at grpo's token "
      "budget (40 on the tiny testbed, 128 on the base), dler at the "
      "starting policy's median length (20, 72), dler_script dler with the "
      "authors' script's extras (a cut-off right answer earns 0.1, +0.1 "
      "on right answers' advantages)."
    ),
    variants={
      "no_limit": ("dler", {"max_new_tokens": 40}),
      "dler": ("dler", {}),
      "dler_script": (
        "dler",
        {"cutoff_reward_scale": 0.1, "correct_advantage_boost": 0.1},
      ),
    },
    base={"no_limit": {"max_new_tokens": 128}},  # the main job's budget
    metric="length",
    expected=(
      "dler's length well below no_limit's and its held-out accuracy (at "
      "its budget) above its start"
    ),
    extra=("accuracy",),
  ),
  "laser": Claim(
    claim=(
      "A step length reward shortens correct responses, and LASER-D's "
      "difficulty-adaptive targets do so with accuracy kept "
      "(arXiv:2505.15612); no_length is the recipe without the reward, "
      "laser_de LASER-D with the authors' bonus for long wrong answers "
      "that do not loop."
    ),
    variants={
      "no_length": ("laser", {"length_reward_scale": 0.0}),
      "laser": ("laser", {"variant": "laser"}),
      "laser_d": ("laser", {}),
      "laser_de": ("laser", {"variant": "laser_de"}),
    },
    metric="length",
    expected=(
      "laser's and laser_d's length below no_length's; laser_d's accuracy "
      "at least laser's"
    ),
    extra=("accuracy", "laser/target_easy", "reward/explore"),
  ),
  "simplerl_zoo": Claim(
    claim=(
      "Zero RL works when the query difficulty matches the model "
      "(arXiv:2503.18892); the held-out set (difficulties 1-2) is shared, "
      "strict_format adds the format-gated reward."
    ),
    variants={
      "matched": ("simplerl_zoo", {}),
      "too_hard": (
        "simplerl_zoo",
        {"data": "task:arithmetic:difficulty=3,n=4000"},
      ),
      "strict_format": ("simplerl_zoo", {"format_reward": "strict"}),
    },
    metric="accuracy",
    expected="matched's held-out accuracy after RL above too_hard's",
    extra=("reward",),
    testbeds=("tiny",),
  ),
  "empo": Claim(
    claim=(
      "Minimising the semantic entropy of the answers, with no labels, "
      "improves accuracy (arXiv:2504.05812); grpo uses the verifier."
    ),
    variants={"empo": ("empo", {}), "grpo": ("grpo", {})},
    metric="accuracy",
    expected="empo's held-out accuracy above its start and near grpo's",
    extra=("empo/semantic_entropy",),
  ),
  "rlpr": Claim(
    claim=(
      "The policy's probability of the reference answer, debiased and "
      "std-filtered, replaces the verifier (arXiv:2506.18254)."
    ),
    variants={"rlpr": ("rlpr", {}), "grpo": ("grpo", {})},
    metric="accuracy",
    expected="rlpr's held-out accuracy above its start and close to grpo's",
    extra=("reward", "rlpr/kept"),
  ),
  "pope": Claim(
    claim=(
      "On hard problems, rollouts guided by an oracle solution prefix "
      "transfer to the unguided problems (POPE); the same recipe without "
      "guidance learns little."
    ),
    variants={
      "pope": ("pope", {}),
      "no_guidance": ("pope", {"prefix_fraction": 0.0}),
    },
    metric="accuracy",
    expected="pope's unguided accuracy ends above no_guidance's",
    extra=("guided/groups", "guided/reward"),
  ),
  "guide": Claim(
    claim=(
      "Hints for all-wrong groups, with the importance ratio taken under "
      "the hint-free context, beat vanilla GRPO (arXiv:2506.13923)."
    ),
    variants={
      "guide": ("guide", {}),
      "hinted_context": ("guide", {"unhinted_context": False}),
      "grpo": ("guide", {"hint_points": 0}),
    },
    metric="accuracy",
    expected="guide's held-out accuracy >= grpo's and hinted_context's",
    extra=("guided/groups", "approx_kl"),
  ),
  "ghpo": Claim(
    claim=(
      "Solution hints of growing length for prompts beyond reach, plain "
      "RL elsewhere, beat GRPO (arXiv:2507.10628)."
    ),
    variants={
      "ghpo": ("ghpo", {}),
      "grpo": ("ghpo", {"hint_ratios": ""}),
    },
    metric="accuracy",
    expected="ghpo's held-out accuracy >= grpo's",
    extra=("guided/groups",),
  ),
  "seele": Claim(
    claim=(
      "Per-problem hint lengths fitted by an IRT model keep rollouts near "
      "the target accuracy and beat GRPO and a fixed hint "
      "(arXiv:2509.06923)."
    ),
    variants={
      "seele": ("seele", {}),
      "fixed_hint": ("seele", {"fixed_ratio": 0.5}),
      "grpo": ("seele", {"fixed_ratio": 0.0, "rounds": 0}),
    },
    metric="accuracy",
    expected="seele's held-out accuracy >= grpo's and fixed_hint's",
    extra=("guided/reward", "seele/hint_ratio"),
  ),
  "dars": Claim(
    claim=(
      "Extra rollouts for low-accuracy prompts raise Pass@K at equal "
      "rollout cost (DARS, arXiv:2508.13755); BroRL widens every group "
      "instead (arXiv:2510.01180)."
    ),
    variants={
      "dars": ("dars", {}),
      "grpo_matched": ("dars", {"extra_groups": 0, "group_size": 12}),
      "brorl": ("dars", {"extra_groups": 0, "group_size": 32, "batch_size": 4}),
      # DARS-B: 4x the prompts, full-batch updates over 2 epochs (dars.DARS_B).
      "dars_b": ("dars", {"variant": "dars_b"}),
    },
    metric="accuracy",
    expected=(
      "dars's eval pass@8 (eval_after.json) >= grpo_matched's; dars_b's "
      "pass@1 and pass@8 >= dars's"
    ),
    extra=("dars/hard_prompts", "dars/extra_accuracy"),
    evals=("eval/pass@1", "eval/pass@8"),
  ),
  "dump": Claim(
    claim=(
      "UCB scheduling over data distributions by mean |advantage| trains "
      "faster than uniform sampling of the mixture (arXiv:2504.09710)."
    ),
    variants={
      "dump": ("dump", {}),
      "uniform": (
        "grpo",
        {"data": "task:arithmetic:difficulty=1-4,n=4000", "max_new_tokens": 76},
      ),
    },
    base={"uniform": BASE_MIXTURE},
    metric="accuracy",
    expected="dump's held-out accuracy >= uniform's",
    extra=("adv_abs",),
  ),
  "kdrl": Claim(
    claim=(
      "GRPO plus reverse-KL distillation from a teacher beats GRPO and "
      "distillation alone (arXiv:2506.02208)."
    ),
    variants={
      "kdrl": ("kdrl", {}),
      "grpo": ("kdrl", {"kd_coef": 0.0}),
      "kd_only": ("kdrl", {"kd_coef": 0.2, "rl_coef": 0.0}),
    },
    metric="accuracy",
    expected="kdrl's held-out accuracy >= grpo's and kd_only's",
    extra=("kd", "kd/logp_gap"),
  ),
  "adacl": Claim(
    claim=(
      "A curriculum on the current policy's difficulty estimates, "
      "re-estimated as it learns, beats uniform sampling of the mixture "
      "(ADCL, arXiv:2505.08364); expert-guided self-reformulation of "
      "failed problems (EGSR) adds to it."
    ),
    variants={
      "adacl": ("adacl", {}),
      "adcl_only": ("adacl", {"egsr": False}),
      # adacl's data, lengths and warm start (half its demonstrations show
      # a hint, for EGSR): only the prompt order differs from adcl_only.
      "uniform": (
        "grpo",
        {
          "data": "task:arithmetic:difficulty=1-4,n=4000",
          "max_new_tokens": 76,
          "max_prompt_len": 128,
          "warm_start_hints": 0.5,
        },
      ),
    },
    base={"uniform": {**BASE_MIXTURE, "max_prompt_len": 128}},
    metric="accuracy",
    expected="adacl's held-out accuracy >= adcl_only's >= uniform's",
    extra=("difficulty/mean_accuracy", "guided/groups"),
  ),
  "ampo": Claim(
    claim=(
      "Off-policy solutions from several sources, only for all-wrong "
      "groups and chosen by the student's comprehension, beat GRPO "
      "(AMPO, arXiv:2510.02227)."
    ),
    variants={
      "ampo": ("ampo", {}),
      "one_source": ("ampo", {"teachers": "reference"}),
      "grpo": ("ampo", {"teachers": ""}),
    },
    metric="accuracy",
    expected="ampo's held-out accuracy >= grpo's and >= one_source's",
    extra=("ampo/guided_groups",),
  ),
  "knowrl": Claim(
    claim=(
      "Training with a minimal-sufficient subset of knowledge-point hints "
      "improves unhinted accuracy over GRPO and over all KPs (KnowRL)."
    ),
    variants={
      "knowrl": ("knowrl", {}),
      "all_kps": ("knowrl", {"select": False}),
      "grpo": ("knowrl", {"use_hints": False}),
    },
    metric="accuracy",
    expected="knowrl's held-out accuracy >= grpo's and all_kps'",
    extra=("knowrl/kps",),
  ),
  "search_r1": Claim(
    claim=(
      "Masking the retrieved tokens out of the loss makes multi-turn search "
      "RL learn better (arXiv:2503.09516, Sec. 5 ablation); multi-turn "
      "episodes over the procedural knowledge base (envs/search.py)."
    ),
    variants={
      "masked": ("search_r1", {}),
      "unmasked": ("search_r1", {"mask_observations": False}),
    },
    metric="accuracy",
    expected="masked's accuracy rises and ends at or above unmasked's",
    extra=("turns", "searches"),
    testbeds=("tiny",),
  ),
  "toolrl": Claim(
    claim=(
      "ToolRL's graded tool-call reward (format + name / parameter / value "
      "matching) trains tool use better than an answer-only reward "
      "(arXiv:2504.13958, reward ablations)."
    ),
    variants={
      "toolrl": ("toolrl", {}),
      "answer_only": (
        "toolrl",
        {"format_coef": 0.0, "correct_coef": 0.0, "answer_coef": 1.0},
      ),
    },
    metric="reward/answer",
    expected="toolrl's answer accuracy at or above answer_only's",
    extra=("reward/tool_call", "reward/format", "turns"),
    testbeds=("tiny",),
  ),
  "treerl": Claim(
    claim=(
      "Entropy-forked tree rollouts with subtree-value process advantages "
      "beat independent chains at the same number of leaves "
      "(arXiv:2506.11902, TreeRL vs ChainRL)."
    ),
    variants={"treerl": ("treerl", {}), "grpo": ("grpo", {"kl_coef": 0.0})},
    metric="accuracy",
    expected="treerl's held-out accuracy at or above grpo's",
    extra=("fork_col",),
  ),
  "igpo": Claim(
    claim=(
      "Information-gain turn rewards give denser credit than the outcome "
      "reward alone on multi-hop search (arXiv:2510.14967)."
    ),
    variants={
      "igpo": ("igpo", {}),
      # The authors' later normalisation: outcomes and gains apart.
      "igpo_separate": ("igpo", {"info_gain_norm": "separate"}),
      # igpo's data and warm start: only the turn credit differs.
      "search_r1": (
        "search_r1",
        {"data": "task:kbqa:difficulty=2,n=300", "warm_start_steps": 100},
      ),
    },
    metric="accuracy",
    expected="igpo's held-out accuracy at or above search_r1's (2-hop)",
    extra=("igpo/info_gain", "turns"),
    testbeds=("tiny",),
  ),
  "ettrl": Claim(
    claim=(
      "Entropy-forked tree rollouts and entropy-based advantage reshaping "
      "improve test-time RL with fewer sampled tokens (arXiv:2508.11356)."
    ),
    variants={"ettrl": ("ettrl", {}), "ttrl": ("ttrl", {})},
    metric="accuracy",
    expected="ettrl's accuracy at or above ttrl's with fewer sampled tokens",
    extra=("tree/sampled_tokens", "ttrl/label_accuracy"),
  ),
  "rm_grpo": Claim(
    claim=(
      "Optimising a learned reward model (InstructGPT's Bradley-Terry RM, "
      "arXiv:2203.02155) over-optimises it: the proxy RM reward keeps "
      "rising while the gold (verifier) accuracy first rises, then stalls "
      "or falls (Gao et al. 2022, arXiv:2210.10760); mixing in the "
      "verifier limits it."
    ),
    variants={
      "rm_only": ("rm_grpo", {}),
      "mixed": ("rm_grpo", {"rm_weight": 0.5}),
      "verifier_only": ("grpo", {}),
    },
    metric="accuracy",
    expected=(
      "rm_only's reward/rm rises to the end while its accuracy ends below "
      "its peak and below verifier_only's; mixed's accuracy in between"
    ),
    extra=("reward/rm", "rm/pair_accuracy"),
  ),
}
