"""A real schema registry on this machine: Apicurio Registry (its Confluent-compatible
API, ``/apis/ccompat/v7``) for development, the demo, the benchmarks and the test suite.
Its Quarkus fast-jar is resolved from Maven Central into ``$TXSTAGE_CACHE_DIR`` (default
``~/.cache/txstage``) and runs as a plain JVM on a Java 21 or later found on the machine.

Modules, each named for its job:

    install.py      ``REGISTRY_VERSION``, ``install()``: the fast-jar, cached once;
                    ``find_java()``: a Java >= 21 (JAVA_HOME, PATH, /usr/lib/jvm, ...)
    process.py      ``Registry``: one JVM on free (or given) ports, storage in H2 (a file
                    in its directory, so a restart keeps the schemas), ready when the
                    management port's ``/health/ready`` answers 200; kill, restart
    cli.py          ``txstage registry install|up|down|status`` (also
                    ``python -m service.local_registry``): one detached registry on
                    127.0.0.1:8081

Nothing is imported here: ``txstage run`` never loads any of it.
"""
