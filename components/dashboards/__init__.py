"""Grafana dashboards shipped as ConfigMaps (picked up by the Grafana sidecar via ``grafana_dashboard: "1"``)."""
