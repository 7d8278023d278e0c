"""Policies: the YAML rule language.

``model`` holds the frozen values the rest of the engine sees (``RuleSet``, ``Group``,
``Policy``); ``loader`` reads and validates files into them, with errors that name file, line
and key. Used by ``gpuops.model.evaluation`` (model only) and ``gpuops.runtime`` (loader).
"""

from gpuops.model.rules.model import Group, Policy, RuleError, RulesError, RuleSet

__all__ = ["Group", "Policy", "RuleError", "RuleSet", "RulesError"]
