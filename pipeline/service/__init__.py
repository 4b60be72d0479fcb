"""Service: the running daemon and what operators see of it: the daemon (start, reload, ordered stop), per-camera workers, the pure reload plan, the status server, health and status documents, Prometheus metrics, previews, systemd notification and logging.

Owns: everything in service/. May import: config, inference, modelprep (its errors), capture, behavior, outputs, vision, core. Only service.daemon writes the daemon's state; the others read a DaemonSnapshot."""
