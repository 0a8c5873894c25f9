module topo-e2e/pause

go 1.22
