"""Policies: the YAML rule language (DESIGN.md section 4).

``model`` holds the frozen values the rest of the engine sees (``RuleSet``, ``Group``,
``Policy``); ``loader`` reads and validates files into them, with errors that name file, line
and key. Used by ``engine.evaluation`` (model only) and ``engine.runtime`` (loader).
"""

from engine.rules.model import Group, Policy, RuleError, RulesError, RuleSet

__all__ = ["Group", "Policy", "RuleError", "RuleSet", "RulesError"]
