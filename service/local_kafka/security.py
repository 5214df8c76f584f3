"""A secured node's TLS material and SASL settings: a CA and a broker certificate made at
start with the JDK's ``keytool`` (no extra Python dependency), a ``SASL_SSL`` listener
with SCRAM-SHA-512, and KRaft's ``StandardAuthorizer`` denying whatever no ACL allows.

The harness keeps its ``PLAINTEXT`` listener next to the secured one, bound to 127.0.0.1,
for itself (creating topics, feeding input, verifying output): its principal,
``User:ANONYMOUS``, is a super user, as it must be on the plaintext controller listener
anyway. Clients under test use only :attr:`Secured.listener` as :data:`ADMIN_USER` (a
super user) or as users of their own, whose SCRAM credentials and ACLs tests create.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._scram import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from service.local_kafka.errors import KafkaStartError
from service.local_kafka.properties import HOST

MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
LISTENER = "SASL_SSL"
_DNAME = "CN=txstage-test-ca,O=txstage"


@dataclass(frozen=True)
class Secured:
    """What a secured cluster's clients need: the CA (PEM) and the admin's credentials.

    ``keystore_password`` protects the broker's PKCS12 keystore (never a client's)."""

    directory: Path
    admin_password: str
    keystore_password: str

    @property
    def ca_location(self) -> str:
        return str(self.directory / "ca.pem")

    @property
    def keystore(self) -> Path:
        return self.directory / "broker.p12"

    def client_config(self, username: str, password: str) -> dict[str, str]:
        """librdkafka properties of a client authenticating as ``username``."""
        return {"security.protocol": LISTENER, "sasl.mechanism": MECHANISM,
                "sasl.username": username, "sasl.password": password,
                "ssl.ca.location": self.ca_location}

    def admin_config(self) -> dict[str, str]:
        return self.client_config(ADMIN_USER, self.admin_password)

    def broker_overrides(self) -> dict[str, str]:
        """``server.properties`` entries of a secured node (its listeners aside)."""
        jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return {
            "sasl.enabled.mechanisms": MECHANISM,
            f"listener.name.{LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.keystore),
            "ssl.keystore.password": self.keystore_password,
            "ssl.key.password": self.keystore_password,
            "ssl.client.auth": "none",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN_USER};User:ANONYMOUS",
        }


def make_secured(directory: Path) -> Secured:
    """A fresh CA, a broker key and certificate for 127.0.0.1/localhost signed by it,
    and random passwords, all under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    secured = Secured(directory, admin_password=secrets.token_urlsafe(18),
                      keystore_password=secrets.token_urlsafe(18))
    ca, pw = directory / "ca.p12", secured.keystore_password
    san = f"SAN=ip:{HOST},dns:localhost"
    _keytool("-genkeypair", "-keystore", ca, "-alias", "ca", "-dname", _DNAME,
             "-ext", "bc:c", "-keyalg", "RSA", "-keysize", "2048", "-validity", "2",
             "-storetype", "PKCS12", "-storepass", pw)
    _keytool("-exportcert", "-rfc", "-keystore", ca, "-alias", "ca", "-storepass", pw,
             "-file", secured.ca_location)
    _keytool("-genkeypair", "-keystore", secured.keystore, "-alias", "broker",
             "-dname", "CN=localhost,O=txstage", "-ext", san, "-keyalg", "RSA",
             "-keysize", "2048", "-validity", "2", "-storetype", "PKCS12", "-storepass", pw)
    csr, signed = directory / "broker.csr", directory / "broker.pem"
    _keytool("-certreq", "-keystore", secured.keystore, "-alias", "broker",
             "-storepass", pw, "-file", csr)
    _keytool("-gencert", "-keystore", ca, "-alias", "ca", "-storepass", pw, "-infile", csr,
             "-outfile", signed, "-ext", san, "-rfc", "-validity", "2")
    _keytool("-importcert", "-noprompt", "-keystore", secured.keystore, "-alias", "ca",
             "-storepass", pw, "-file", secured.ca_location)
    _keytool("-importcert", "-noprompt", "-keystore", secured.keystore, "-alias", "broker",
             "-storepass", pw, "-file", signed)
    return secured


def _keytool(*args: str | Path) -> None:
    keytool = shutil.which("keytool")
    if keytool is None:
        raise KafkaStartError("`keytool` not found (it comes with the JDK that runs Kafka)")
    result = subprocess.run([keytool, *map(str, args)], capture_output=True, text=True,
                            check=False, timeout=60)
    if result.returncode != 0:
        raise KafkaStartError(f"keytool {args[0]} failed: {result.stdout}{result.stderr}")


def upsert_scram_user(admin: AdminClient, username: str, password: str) -> None:
    """Create (or change the password of) a SCRAM-SHA-512 user through the admin API."""
    upsertion = UserScramCredentialUpsertion(
        username, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode())
    for future in admin.alter_user_scram_credentials([upsertion]).values():
        future.result(30)
