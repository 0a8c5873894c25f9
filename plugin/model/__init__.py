"""The resource model: resources from a topology, and what a container gets (GPU/NIC, sharing, MIG, CDI)."""
