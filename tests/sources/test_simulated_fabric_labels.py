"""`--simulate` nodes carry the clique label too: the NFD feature file follows the simulated node file.

The cluster tests serve simulated nodes, so the label must come from the simulated source as it
does from hardware. Real files and real inotify: the node file is edited while `watch` runs.
"""

from __future__ import annotations

import asyncio
import os

import yaml

from plugin.cli.options import resolve
from plugin.cli.typed import make_source
from plugin.config.flags import options_for
from plugin.sources.fabric_labels import CLIQUE_LABEL
from plugin.sources.simulated import builtin_text, load_simulated


def labels(path) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        return dict(line.strip().split("=", 1) for line in f if line.strip() and not line.startswith("#"))


def source_for(node_file, label_file):
    params = {o.dest: o.default_for("serve") for o in options_for("serve")}
    params |= {"simulate": str(node_file), "fabric_labels_file": str(label_file)}
    return make_source(resolve(params, {}, "serve"))


async def wait_for(pred, timeout: float = 30.0):
    for _ in range(int(timeout / 0.02)):
        if pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_the_label_file_follows_the_simulated_node_file(tmp_path):
    data = yaml.safe_load(builtin_text("gb300-cx8-dd"))
    node_file = tmp_path / "node.yaml"
    node_file.write_text(yaml.safe_dump(data, sort_keys=False))
    label_file = tmp_path / "features.d" / "topo-device-plugin-clique"
    label_file.parent.mkdir()
    src = source_for(node_file, label_file)
    current = src.load()
    (clique,) = {g.fabric.clique for g in load_simulated("gb300-cx8-dd").gpus}
    assert labels(label_file) == {CLIQUE_LABEL: clique}
    published = []
    task = asyncio.create_task(src.watch(current, published.append))
    try:
        await asyncio.sleep(0)  # the watch arms inotify and stamps the file before its first wait
        for g in data["gpus"]:
            g["fabric"]["cliqueId"] = 3
        tmp = tmp_path / "node.tmp"
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, node_file)
        await wait_for(lambda: published)
        assert labels(label_file) == {CLIQUE_LABEL: clique.rsplit(".", 1)[0] + ".3"}
        for g in data["gpus"]:
            del g["fabric"]
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, node_file)
        await wait_for(lambda: len(published) == 2)
        assert not label_file.exists()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

