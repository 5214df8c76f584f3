"""What the operator tools' commands (``txstage audit``, ``txstage redrive``) share: how a
failure becomes one line on stderr and an exit code (service/exit_codes.py)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from service.errors import ConfigError, DeniedError, KafkaOperationError, UnfinishedError
from service.exit_codes import ExitCode
from service.kafka.config import refused_configs
from service.kafka.errors import untranslated
from service.settings import Settings, load_settings


def tool_settings() -> Settings:
    """The stage's settings, checked as ``txstage run`` checks them: also what
    librdkafka would refuse in its clients (else a tool failed making its first
    client, "could not finish", exit 4)."""
    settings = load_settings()
    refused = refused_configs(settings)
    if refused:
        raise ConfigError(*refused)
    return settings


def run_tool(name: str, body: Callable[[], int], *, unfinished_hint: str = "") -> int:
    """``body()``'s exit code; bad settings, an unknown topic or a missing permission
    exit 2 naming it, a cluster failure or a time-out 4. Anything else is a bug in the
    tool, not the cluster's doing: its traceback, and exit 70."""
    try:
        # kafka/reading.py raises librdkafka's own error to the tools: "could not
        # finish", 4 (an UnfinishedError here, with librdkafka's message).
        with untranslated():
            return body()
    except DeniedError as exc:  # before KafkaOperationError: a permission, not the cluster
        print(f"txstage {name}: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"txstage {name}: config error: {problem}", file=sys.stderr)
        return ExitCode.CONFIG
    except (LookupError, PermissionError) as exc:
        print(f"txstage {name}: {exc.args[0]}", file=sys.stderr)
        return ExitCode.CONFIG
    except (KafkaOperationError, TimeoutError, UnfinishedError) as exc:
        print(f"txstage {name}: could not finish{unfinished_hint}: {exc}", file=sys.stderr)
        return ExitCode.UNFINISHED
    except Exception:
        traceback.print_exc()
        print(f"txstage {name}: a bug in txstage {name} (the traceback above; please "
              f"report it): the cluster is not the cause", file=sys.stderr)
        return ExitCode.BUG
