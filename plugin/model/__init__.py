"""The resource model: a topology turned into served resources and what a container gets (GPU/NIC answers, sharing, MIG, CDI)."""
