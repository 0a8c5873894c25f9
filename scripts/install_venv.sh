# Sourced by scripts/demo.sh and scripts/test.sh: the project, editable, in .venv of the checkout.
# Installs only when .venv lacks it or pyproject.toml (the dependencies) changed since the last
# install, so a second run starts at once; pip's own output (setuptools' boxed notice about
# editable installs among it) is kept in .venv/install.log and shown only when pip fails.
# Usage: install_venv EXTRA   (EXTRA: "" for the product alone, "test" for the suite's tools)
install_venv() {
    local extra=$1 spec=. python=${PYTHON:-python3}
    [ -n "$extra" ] && spec=".[$extra]"
    [ -x .venv/bin/python ] || "$python" -m venv .venv
    local want stamp=.venv/.topo-installed
    want="$(sha256sum pyproject.toml | cut -d' ' -f1) $spec"
    if [ -f "$stamp" ] && grep -qxF "$want" "$stamp" && .venv/bin/python -c 'import plugin' 2>/dev/null; then
        return 0
    fi
    if ! { .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip &&
           .venv/bin/python -m pip install -q --disable-pip-version-check -e "$spec"; } >.venv/install.log 2>&1; then
        cat .venv/install.log >&2
        echo "installing the project into .venv failed (pip's output above, also in .venv/install.log)" >&2
        return 1
    fi
    # A test install also satisfies the demo; the demo's install does not satisfy the tests.
    { [ "$spec" = . ] || echo "$(sha256sum pyproject.toml | cut -d' ' -f1) ."; echo "$want"; } >"$stamp"
}
