#!/bin/sh
# kafka-run-class.sh <main class> [args]: what every script here runs.
exec java ${KAFKA_HEAP_OPTS:--Xmx512m} -Djava.awt.headless=true \
    -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
    -cp '/opt/kafka/libs/*' "$@"
