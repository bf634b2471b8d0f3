"""Describing a cluster: hosts files, YAML templates, and the ``Cluster`` value they produce."""

from ddlctl.cluster.model import ROLES, Cluster, Host, local_cluster

__all__ = ["ROLES", "Cluster", "Host", "local_cluster"]
