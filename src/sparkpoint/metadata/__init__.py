"""Job metadata kept across restarts: the coordinator stream and the metadata store on it."""
