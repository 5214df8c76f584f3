"""Deployment files: alert rules, Prometheus and Grafana config, compose, Kubernetes, Dockerfile.

None of these run in the unit suite (no Docker engine, no cluster), so each is
checked for what would break in production: a probe on the wrong path, an
alert on a metric that does not exist, an env name the settings ignore. When
``promtool`` is on PATH the rules also go through Prometheus's own checker and
the unit tests in ``deploy/prometheus/alerts_test.yml``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from service.contract.loading import load_transform
from service.observability.metrics import Metrics
from service.passthrough import PASSTHROUGH_PREFIXES
from service.settings import FILE_SUFFIX, Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
K8S = ROOT / "deploy" / "k8s"
METRIC_TOKEN = re.compile(r"\btxstage_[a-z0-9_]+")
DURATION = re.compile(r"^\d+[smhd]$")
METRICS_PORT = 9108


# --- helpers -------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@cache
def series_names() -> frozenset[str]:
    """Every series name a PromQL query may use for a metric that Metrics registers."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",), "info": ("_info",)}
    families = list(Metrics(CollectorRegistry()).registry.collect())
    return frozenset(f.name + s for f in families for s in suffixes[f.type])


def unknown_metrics(exprs: list[str]) -> set[str]:
    return {token for e in exprs for token in METRIC_TOKEN.findall(e)} - series_names()


def alert_rules() -> list[dict[str, Any]]:
    doc = load_yaml(PROMETHEUS / "alerts.yml")
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((GRAFANA / "txstage-dashboard.json").read_text())
    return loaded


def dashboard_panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p["targets"]]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml(ROOT / "docker-compose.yml")
    return loaded


def k8s(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml(K8S / name)
    return loaded


def pod_spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = k8s(name)["spec"]["template"]["spec"]
    return spec


def promtool(*args: str, cwd: Path) -> None:
    """Run promtool when it is there: on PATH, or ``$TXSTAGE_PROMTOOL`` (``make test``
    fetches it with deploy/tools/promtool.sh from Debian's ``prometheus`` package)."""
    exe = os.environ.get("TXSTAGE_PROMTOOL") or shutil.which("promtool")
    if not exe:
        return
    done = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def settings_env_names() -> set[str]:
    return {f"TXSTAGE_{name.upper()}" for name in Settings.model_fields}


def is_setting(env_name: str) -> bool:
    """A name the settings read: a field, or a librdkafka pass-through."""
    upper = env_name.upper()
    prefixes = [q for p in PASSTHROUGH_PREFIXES.values()
                for q in (p, p.removesuffix("__") + FILE_SUFFIX)]
    passthrough = any(upper.startswith(p) and len(upper) > len(p) for p in prefixes)
    return passthrough or upper in settings_env_names()


def markdown_anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", path.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


# --- Prometheus alert rules ----------------------------------------------------


def test_alert_rules_are_valid_prometheus_rules() -> None:
    doc = load_yaml(PROMETHEUS / "alerts.yml")
    assert set(doc) == {"groups"}
    for group in doc["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"Txstage[A-Z][A-Za-z]+", rule["alert"])
            assert DURATION.match(rule["for"]), rule["for"]
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert {"summary", "description", "runbook"} <= set(rule["annotations"])
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names)), "duplicate alert names"
    promtool("check", "rules", "alerts.yml", cwd=PROMETHEUS)
    promtool("test", "rules", "alerts_test.yml", cwd=PROMETHEUS)


def test_alert_expressions_use_only_exported_metrics() -> None:
    exprs = [rule["expr"] for rule in alert_rules()]
    assert unknown_metrics(exprs) == set()
    assert unknown_metrics(["rate(txstage_transactions_committed[5m])"]) == {
        "txstage_transactions_committed"}, "a counter without _total must be flagged"


def test_alerts_cover_the_failure_modes_operators_need() -> None:
    exprs = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    must_watch = {
        "txstage_transactions_aborted_total": "aborts by reason",
        "txstage_transaction_commit_seconds_bucket": "commit latency p99",
        "txstage_consumer_lag": "lag growing",
        "txstage_transactions_committed_total": "no commits while lagging",
        "txstage_ready": "replica not ready",
        "txstage_producers_fenced_total": "producers fenced",
        "txstage_oldest_open_transaction_seconds": "transaction near its timeout",
    }
    watched = {token for e in exprs.values() for token in METRIC_TOKEN.findall(e)}
    assert set(must_watch) - watched == set()
    assert any(e.startswith("up{") for e in exprs.values()), "replica down"
    assert "by (job, reason)" in exprs["TxstageAbortRateHigh"]


def test_every_alert_has_a_unit_test_and_a_runbook_section() -> None:
    tested = {case["alertname"] for test in load_yaml(PROMETHEUS / "alerts_test.yml")["tests"]
              for case in test["alert_rule_test"]}
    anchors = markdown_anchors(ROOT / "docs" / "operations.md")
    for rule in alert_rules():
        assert rule["alert"] in tested, f"{rule['alert']} has no case in alerts_test.yml"
        doc, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert doc == "docs/operations.md"
        assert anchor == rule["alert"].lower() and anchor in anchors, anchor


def test_prometheus_configs_scrape_the_txstage_job_and_load_the_rules() -> None:
    for name in ("prometheus.yml", "prometheus-kubernetes.yml"):
        config = load_yaml(PROMETHEUS / name)
        assert config["rule_files"] == ["alerts.yml"]
        [job] = config["scrape_configs"]
        assert job["job_name"] == "txstage", "the alert rules select job=txstage"
    [static] = load_yaml(PROMETHEUS / "prometheus.yml")["scrape_configs"][0]["static_configs"]
    replicas = {s for s in compose()["services"] if s.startswith("txstage-")}
    assert set(static["targets"]) == {f"{r}:{METRICS_PORT}" for r in replicas}
    # Debian's promtool is built without Kubernetes discovery, so only this one.
    promtool("check", "config", "prometheus.yml", cwd=PROMETHEUS)


def test_kubernetes_scrape_config_follows_the_pod_annotations() -> None:
    [job] = load_yaml(PROMETHEUS / "prometheus-kubernetes.yml")["scrape_configs"]
    sources = {label for rc in job["relabel_configs"] for label in rc.get("source_labels", [])}
    annotations = k8s("deployment.yaml")["spec"]["template"]["metadata"]["annotations"]
    for key in annotations:
        sanitized = re.sub(r"[^a-zA-Z0-9_]", "_", key)
        assert f"__meta_kubernetes_pod_annotation_{sanitized}" in sources


# --- Grafana -------------------------------------------------------------------


def test_dashboard_is_a_grafana_dashboard() -> None:
    dash = dashboard()
    assert dash["uid"] == "txstage" and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard_panels():
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))


def test_dashboard_queries_use_only_exported_metrics() -> None:
    assert unknown_metrics(dashboard_exprs()) == set()


def test_dashboard_shows_what_the_operator_needs() -> None:
    exprs = dashboard_exprs()

    def shown(pattern: str) -> bool:
        return any(re.search(pattern, e) for e in exprs)

    assert shown(r"rate\(txstage_records_consumed_total")
    assert shown(r"by \(topic\) \(rate\(txstage_records_produced_total")
    for quantile in ("0.5", "0.99"):
        commit_bucket = "txstage_transaction_commit_seconds_bucket"
        assert shown(rf"histogram_quantile\({quantile}, .*{commit_bucket}")
    assert shown(r"by \(reason\) \(rate\(txstage_transactions_aborted_total")
    assert shown(r"by \(topic, partition\) \(txstage_consumer_lag")
    assert shown(r"txstage_pinned_producers")
    assert shown(r"by \(kind\) \(increase\(txstage_rebalances_total")
    assert shown(r"txstage_records_dead_lettered_total")
    assert shown(r"txstage_oldest_open_transaction_seconds")
    assert shown(r"histogram_quantile\(0.99, .*txstage_end_to_end_seconds_bucket")


def test_grafana_provisioning_matches_the_compose_mounts() -> None:
    [source] = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")[
        "datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    [provider] = load_yaml(GRAFANA / "provisioning" / "dashboards" / "txstage.yml")["providers"]
    mounts = dict(v.split(":")[:2] for v in compose()["services"]["grafana"]["volumes"])
    assert mounts["./deploy/grafana/txstage-dashboard.json"].startswith(
        provider["options"]["path"] + "/")
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"


# --- docker-compose ------------------------------------------------------------


REQUIRED_ENV = {
    "TXSTAGE_BOOTSTRAP_SERVERS", "TXSTAGE_GROUP_ID", "TXSTAGE_INPUT_TOPICS",
    "TXSTAGE_OUTPUT_TOPIC", "TXSTAGE_TRANSFORM", "TXSTAGE_DLQ_TOPIC",
    "TXSTAGE_METRICS_PORT", "TXSTAGE_LOG_FORMAT",
}


def replicas() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose()["services"].items() if n.startswith("txstage-")}


def test_compose_has_the_demo_services() -> None:
    services = compose()["services"]
    assert {"kafka", "topics", "txstage-1", "txstage-2", "prometheus", "grafana"} <= set(services)
    kafka = services["kafka"]
    assert kafka["image"] == "apache/kafka:4.1.1"
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"], "KRaft, no ZooKeeper"
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_compose_creates_the_topics_the_replicas_use() -> None:
    script = "\n".join(compose()["services"]["topics"]["command"])
    created = dict(re.findall(r"\b(txstage-[a-z]+):(\d+)", script))
    assert created["txstage-in"] == "8"
    env = next(iter(replicas().values()))["environment"]
    assert {env["TXSTAGE_INPUT_TOPICS"], env["TXSTAGE_OUTPUT_TOPIC"],
            env["TXSTAGE_DLQ_TOPIC"]} <= set(created)


def test_compose_replicas_are_configured_by_real_settings() -> None:
    assert len(replicas()) == 2
    for name, service in replicas().items():
        env = service["environment"]
        assert set(env) >= REQUIRED_ENV, name
        assert all(is_setting(key) for key in env), [k for k in env if not is_setting(k)]
        settings = load_settings(env)
        assert settings.group_id == "txstage-demo"
        assert settings.input_topics == ("txstage-in",)
        assert (settings.output_topic, settings.dlq_topic) == ("txstage-out", "txstage-dlq")
        assert settings.transform == "service.examples.square:square"
        load_transform(settings.transform)
        assert settings.metrics_port == METRICS_PORT
        assert service["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        assert seconds(service["stop_grace_period"]) > settings.shutdown_timeout_s


def test_compose_replicas_publish_distinct_metrics_ports() -> None:
    published = [p.split(":")[0] for s in replicas().values() for p in s["ports"]]
    assert len(published) == len(set(published))
    assert all(p.endswith(f":{METRICS_PORT}") for s in replicas().values() for p in s["ports"])


def test_compose_monitoring_uses_the_deploy_configs() -> None:
    services = compose()["services"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]


def test_is_setting_rejects_unknown_names() -> None:
    assert is_setting("TXSTAGE_GROUP_ID") and is_setting("TXSTAGE_KAFKA__sasl.password")
    assert is_setting("TXSTAGE_KAFKA_FILE__sasl.password")
    assert not is_setting("TXSTAGE_GROUPID") and not is_setting("TXSTAGE_KAFKA__")


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, duration
    return int(match[1]) * (60 if match[2] == "m" else 1)


# --- Kubernetes ----------------------------------------------------------------


def k8s_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            yield path.name, doc


def test_k8s_manifests_parse_and_are_objects() -> None:
    kinds = {}
    for name, doc in k8s_documents():
        assert {"apiVersion", "kind"} <= set(doc), name
        if doc["kind"] != "Kustomization":
            assert "name" in doc["metadata"] or "generateName" in doc["metadata"], name
        kinds[doc["kind"]] = name
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget",
            "HorizontalPodAutoscaler", "Job", "Kustomization"} <= set(kinds)


def test_kustomization_lists_existing_files_and_leaves_the_job_out() -> None:
    resources = k8s("kustomization.yaml")["resources"]
    assert all((K8S / r).is_file() for r in resources)
    assert {"deployment.yaml", "service.yaml", "configmap.yaml", "pdb.yaml"} <= set(resources)
    assert "backfill-job.yaml" not in resources


def test_the_audit_cronjob_runs_a_valid_audit_with_the_stage_settings_as_its_own_user() -> None:
    from service.tools.audit.cli import parser

    job = k8s("audit-cronjob.yaml")["spec"]["jobTemplate"]["spec"]
    [audit] = job["template"]["spec"]["containers"]
    assert audit["args"][0] == "audit"
    parser().parse_args(audit["args"][1:])  # exits 2 (SystemExit) if the args are wrong
    assert audit["envFrom"] == container()["envFrom"]
    env = {e["name"]: e["value"] for e in audit["env"]}
    assert env == {"TXSTAGE_KAFKA__sasl.username": "txstage-audit"}
    assert audit["securityContext"]["readOnlyRootFilesystem"] is True
    assert job["backoffLimit"] == 0


def container(name: str = "deployment.yaml") -> dict[str, Any]:
    [only] = pod_spec(name)["containers"]
    return only


def test_probes_point_at_healthz_and_readyz_on_the_metrics_port() -> None:
    main = container()
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    config = k8s("configmap.yaml")["data"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = main[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == METRICS_PORT
    assert int(config["TXSTAGE_METRICS_PORT"]) == METRICS_PORT
    annotations = k8s("deployment.yaml")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_deployment_runs_non_root_on_a_read_only_root_filesystem() -> None:
    spec, main = pod_spec("deployment.yaml"), container()
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"requests", "limits"} <= set(main["resources"])
    assert "/tmp" in {m["mountPath"] for m in main["volumeMounts"]}


def test_deployment_grace_period_outlasts_the_shutdown_commit() -> None:
    deployment = k8s("deployment.yaml")
    assert deployment["spec"]["replicas"] == 2
    shutdown = float(k8s("configmap.yaml")["data"]["TXSTAGE_SHUTDOWN_TIMEOUT_S"])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= shutdown + 10


def test_deployment_takes_settings_from_the_configmap_and_secrets_from_mounted_files() -> None:
    main = container()
    config_map = k8s("configmap.yaml")["metadata"]["name"]
    assert main["envFrom"] == [{"configMapRef": {"name": config_map}}]
    assert "env" not in main, "secrets are mounted files, not environment variables"
    data = k8s("configmap.yaml")["data"]
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec("deployment.yaml")["volumes"]}
    files = {f"{mounts[name]}/{item['path']}": (v["secret"]["secretName"], item["key"])
             for name, v in volumes.items() if "secret" in v and name in mounts
             for item in v["secret"]["items"]}
    assert files[data["TXSTAGE_KAFKA_FILE__sasl.password"]] == ("txstage-kafka", "sasl.password")
    assert files[data["TXSTAGE_KAFKA__ssl.ca.location"]] == ("txstage-kafka", "ca.pem")


def test_configmap_is_valid_settings(tmp_path: Path) -> None:
    data = k8s("configmap.yaml")["data"]
    assert all(is_setting(key) for key in data), [k for k in data if not is_setting(k)]
    password = tmp_path / "sasl.password"
    password.write_text("x\n")
    settings = load_settings({**data, "TXSTAGE_KAFKA_FILE__sasl.password": str(password)})
    assert settings.kafka["sasl.password"].get_secret_value() == "x"
    assert settings.kafka["security.protocol"].get_secret_value() == "SASL_SSL"


def test_selectors_match_the_pods_they_mean() -> None:
    pod_labels = k8s("deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    selectors = {
        "deployment": k8s("deployment.yaml")["spec"]["selector"]["matchLabels"],
        "service": k8s("service.yaml")["spec"]["selector"],
        "pdb": k8s("pdb.yaml")["spec"]["selector"]["matchLabels"],
    }
    for owner, selector in selectors.items():
        assert selector.items() <= pod_labels.items(), owner
    job_labels = k8s("backfill-job.yaml")["spec"]["template"]["metadata"]["labels"]
    assert not selectors["deployment"].items() <= job_labels.items(), "Job pods must not count"


def test_service_exposes_the_metrics_port() -> None:
    [port] = k8s("service.yaml")["spec"]["ports"]
    assert port["port"] == METRICS_PORT and port["targetPort"] == "metrics"


def test_hpa_targets_the_deployment_and_stays_within_the_partition_count() -> None:
    hpa = k8s("hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"]["name"] == k8s("deployment.yaml")["metadata"]["name"]
    assert "scale up to the input partition count at most" in (K8S / "hpa.yaml").read_text()
    demo_partitions = 8
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"] <= demo_partitions


def test_backfill_job_runs_the_backfill_command_with_the_same_settings() -> None:
    job = k8s("backfill-job.yaml")
    spec, main = job["spec"]["template"]["spec"], container("backfill-job.yaml")
    assert spec["restartPolicy"] == "Never"
    assert main["args"][0] == "backfill"
    assert main["envFrom"] == container()["envFrom"]
    assert main["securityContext"]["readOnlyRootFilesystem"] is True


# --- Dockerfile ----------------------------------------------------------------


def dockerfile_stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """``[(stage name, [(INSTRUCTION, arguments)])]``, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, args = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            stages.append((args.split(" AS ")[-1].strip() if " AS " in args else args, []))
        elif stages:
            stages[-1][1].append((instruction.upper(), args.strip()))
    return stages


def final_stage() -> dict[str, list[str]]:
    name, instructions = dockerfile_stages()[-1]
    assert name == "runtime"
    found: dict[str, list[str]] = {}
    for instruction, args in instructions:
        found.setdefault(instruction, []).append(args)
    return found


def test_dockerfile_is_multi_stage_on_python_slim() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    assert len(dockerfile_stages()) >= 2


def test_dockerfile_default_image_runs_the_stage_as_non_root() -> None:
    final = final_stage()
    assert final["ENTRYPOINT"] == ['["txstage"]']
    assert final["CMD"] == ['["run"]']
    assert final["EXPOSE"] == [str(METRICS_PORT)]
    assert final["STOPSIGNAL"] == ["SIGTERM"]
    [user] = final["USER"]
    assert user.split(":")[0] not in {"0", "root"}
    [check] = final["HEALTHCHECK"]
    assert "/healthz" in check and "python -c" in check and "curl" not in check


def test_dockerfile_default_image_has_no_spark() -> None:
    stages = dict(dockerfile_stages())
    copies = [args for instr, args in stages["runtime"] if instr == "COPY"]
    assert copies == ["--from=build /opt/txstage /opt/txstage"]
    build_runs = " ".join(args for instr, args in stages["build"] if instr == "RUN")
    assert "spark" not in build_runs


def test_dockerignore_lets_in_exactly_what_the_build_copies() -> None:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert "*" in lines, "allow-list style: ignore everything, then re-include"
    sources = {src.rstrip("/") for _, instructions in dockerfile_stages()
               for instr, args in instructions if instr == "COPY" and "--from" not in args
               for src in args.split()[:-1]}
    assert sources == allowed
