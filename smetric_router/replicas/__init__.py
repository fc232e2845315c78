"""Router replicas that decide as one: each publishes its own in-flight counts to the others."""
