"""The recipe under check: the loaded file, the stage overlay applied, and the dotted recipe
key (with file:line) behind every flag and environment variable, so each check names what to
fix and where."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipeval.engines import Engine, engine_for
from recipeval.recipe import LoadedRecipe, Resolved, resolve
from recipeval.recipe.resolve import flag_present
from recipeval.result import Check, Severity


@dataclass(frozen=True)
class Subject:
    loaded: LoadedRecipe
    resolved: Resolved

    @classmethod
    def of(cls, loaded: LoadedRecipe, stage: str | None) -> Subject:
        return cls(loaded, resolve(loaded.recipe, stage))

    @property
    def recipe(self):  # -> Recipe
        return self.loaded.recipe

    @property
    def engine(self) -> Engine:
        return engine_for(self.recipe.engine)

    @property
    def stage(self) -> str | None:
        return self.resolved.stage

    @property
    def args(self) -> dict[str, Any]:
        """Flags as the launch carries them: recipe args + stage overlay, false/null dropped."""
        return self.resolved.args

    @property
    def env(self) -> dict[str, str]:
        return self.resolved.env

    def arg(self, flag: str, default: Any = None) -> Any:
        return self.resolved.args.get(flag, default)

    def int_arg(self, flag: str, default: int | None = None) -> int | None:
        """The flag as a count; `default` when unset or unreadable (args.integers reports
        an unreadable one)."""
        value = self.arg(flag)
        if value is None or isinstance(value, bool):
            return default
        try:
            return int(value)
        except (TypeError, ValueError):
            return default

    def flag_on(self, flag: str) -> bool:
        """A bare flag is on when present and not false/null (the loader drops those)."""
        return flag_present(self.arg(flag))

    def arg_key(self, flag: str) -> str:
        """Dotted recipe key that sets `flag`: the stage overlay wins over `args`."""
        recipe = self.recipe
        if self.stage is not None and flag in getattr(recipe.stages, self.stage).args:
            return f"stages.{self.stage}.args.{flag}"
        if flag in recipe.args:
            return f"args.{flag}"
        if flag in recipe.model.args:
            return f"model.args.{flag}"
        return f"args.{flag}"

    def env_key(self, name: str) -> str:
        if self.stage is not None and name in getattr(self.recipe.stages, self.stage).env:
            return f"stages.{self.stage}.env.{name}"
        return f"env.{name}"

    def where(self, key: str | None) -> str:
        file, line = self.loaded.origin(key) if key else (self.loaded.path, 1)
        return f"{file}:{line}"

    def check(
        self,
        id: str,
        ok: bool,
        message: str,
        *,
        key: str | None = None,
        severity: Severity = "error",
        value: Any = None,
        threshold: Any = None,
    ) -> Check:
        """A Check; a failing one's message ends with the file:line that set `key`."""
        if not ok and key:
            message = f"{message} [{key} at {self.where(key)}]"
        return Check(
            id=id,
            ok=ok,
            severity=severity,
            message=message,
            key=key,
            value=value,
            threshold=threshold,
        )
