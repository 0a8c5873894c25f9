"""The local cluster's certificates and kubeconfigs, made with openssl.

One CA signs everything: the API server's serving certificate (SANs for 127.0.0.1, the
node IP, the service IP and the `kubernetes.default...` names) and one client certificate
per identity (admin in `system:masters`, the controller manager, the scheduler, the node
`system:node:<name>` in `system:nodes`, and the API server's client for the kubelet). The
service-account signing key is a separate key pair. EC P-256 keys: quick to make.
"""

from __future__ import annotations

import base64
import pathlib
import subprocess
from dataclasses import dataclass

DAYS = "2"


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


def _key(path: pathlib.Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path), cwd=path.parent)


@dataclass(frozen=True)
class Identity:
    name: str
    cert: pathlib.Path
    key: pathlib.Path


class PKI:
    def __init__(self, directory: pathlib.Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_cert = self.dir / "ca.crt"
        self.ca_key = self.dir / "ca.key"
        self.sa_key = self.dir / "sa.key"
        self.sa_pub = self.dir / "sa.pub"

    def make_ca(self) -> None:
        _key(self.ca_key)
        _openssl("req", "-x509", "-new", "-key", str(self.ca_key), "-subj", "/CN=topo-e2e-ca", "-days", DAYS,
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
                 "-out", str(self.ca_cert), cwd=self.dir)
        _key(self.sa_key)
        _openssl("pkey", "-in", str(self.sa_key), "-pubout", "-out", str(self.sa_pub), cwd=self.dir)

    def issue(self, name: str, cn: str, org: str | None = None, *, server_sans: list[str] | None = None) -> Identity:
        key, csr, cert, ext = (self.dir / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
        _key(key)
        subj = f"/CN={cn}" + (f"/O={org}" if org else "")
        _openssl("req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr), cwd=self.dir)
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
        if server_sans:
            lines += ["extendedKeyUsage=serverAuth,clientAuth", "subjectAltName=" + ",".join(server_sans)]
        else:
            lines.append("extendedKeyUsage=clientAuth")
        ext.write_text("\n".join(lines) + "\n")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert), "-CAkey", str(self.ca_key),
                 "-CAcreateserial", "-days", DAYS, "-extfile", str(ext), "-out", str(cert), cwd=self.dir)
        return Identity(name, cert, key)

    def kubeconfig(self, who: Identity, server: str) -> pathlib.Path:
        """A kubeconfig for `who` (certificates embedded, so it is one self-contained file)."""
        def b64(p: pathlib.Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        path = self.dir / f"{who.name}.kubeconfig"
        path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: topo-e2e
  cluster:
    server: {server}
    certificate-authority-data: {b64(self.ca_cert)}
users:
- name: {who.name}
  user:
    client-certificate-data: {b64(who.cert)}
    client-key-data: {b64(who.key)}
contexts:
- name: {who.name}@topo-e2e
  context: {{cluster: topo-e2e, user: {who.name}}}
current-context: {who.name}@topo-e2e
""")
        path.chmod(0o600)
        return path
