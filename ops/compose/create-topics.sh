#!/bin/sh
# Creates the worker's Kafka topics; safe to run again (--if-not-exists).
# The compose stack's one-shot `topics` service runs it inside the apache/kafka
# image; against a real cluster (RUNBOOK "Deploy"):
#
#   BOOTSTRAP=kafka-0.kafka:9092 REPLICATION=3 \
#     KAFKA_TOPICS=/path/to/kafka/bin/kafka-topics.sh sh ops/compose/create-topics.sh
#
# The names are the defaults of config/*.json (kafka.request_topic,
# kafka.dlt_topic, kafka.cancel_topic) and of `mllama submit`'s reply topic.
# With TENANTS="acme beta" (the names of the worker's "tenants", service/README
# "Tenants") each tenant gets its own request, cancel and reply topic instead,
# named as the worker derives them: mllama.requests.<name>,
# mllama.cancel.<name>, mllama.replies.<name>. Grant each tenant's principal
# WRITE on its request and cancel topics and READ on its reply topics, and no
# one else: the topic a record comes from is its tenant.
#
# GATEWAYS="compose" (the gateway.instance names of the HTTP gateways,
# service/gateway/README.md) creates each instance's own reply topic: per
# tenant <tenant reply topic>.gw-<instance> (mllama.replies.acme.gw-compose),
# without tenants mllama.replies.gw-<instance>. A gateway with
# gateway.create_reply_topics true creates them itself (it then needs CREATE
# on them, ops/RUNBOOK.md "Gateway ACLs").
set -eu

bootstrap=${BOOTSTRAP:-localhost:9092}
replication=${REPLICATION:-1}
kafka_topics=${KAFKA_TOPICS:-/opt/kafka/bin/kafka-topics.sh}

# Requests may carry images inline up to limits.max_request_bytes.
max_request_bytes=33554432
# Every record the worker writes (reply records up to limits.max_reply_bytes,
# dead letters cut to it) fits the producer's message.max.bytes of
# config/production.example.json: the topics it writes take as much, so the
# broker never refuses one. Run the brokers with auto.create.topics.enable=false:
# the worker never creates a topic, reply topics are created here.
max_record_bytes=33554432
# Replies are streamed chunks, read within seconds; a day covers a slow reader.
reply_retention_ms=86400000
# Dead letters wait for a human: two weeks.
dlt_retention_ms=1209600000
# Cancel records are keyed by request id, and every id is new, so compaction
# alone would keep them forever; deletion after a day bounds the topic.
cancel_retention_ms=86400000
# A gateway reads its reply topic live, from the end it saw at start, and a
# request lives at most gateway.request_timeout_s (600 s): an hour is ample.
gateway_reply_retention_ms=3600000
# gateway.reply_partitions of config/*.json.
gateway_reply_partitions=4
# Request and cancel records carry the broker's append time: the worker orders
# a cancel against its request by it (service/protocol/README.md, "Delivery
# contract for frontends"), and a producer's CreateTime is whatever the producer chose.
append_time=message.timestamp.type=LogAppendTime
tenants=${TENANTS:-}
gateways=${GATEWAYS:-}
for t in $tenants; do
  case $t in
    *[!a-z0-9_-]*) bad=1 ;;
    *) bad=$(( ${#t} > 48 )) ;;
  esac
  if [ "$bad" = 1 ]; then
    echo "create-topics.sh: tenant '$t': expected [a-z0-9_-]{1,48}" >&2
    exit 2
  fi
done
# gateway.instance is sanitized to [a-z0-9-] by the gateway; a name here must
# already be what it becomes.
for g in $gateways; do
  case $g in
    *[!a-z0-9-]* | '') echo "create-topics.sh: gateway instance '$g': expected [a-z0-9-]+" >&2; exit 2 ;;
  esac
done

create() {
  name=$1 partitions=$2
  shift 2
  "$kafka_topics" --bootstrap-server "$bootstrap" --create --if-not-exists \
    --topic "$name" --partitions "$partitions" --replication-factor "$replication" "$@"
}

# The partition count of the request topic bounds the useful number of workers:
# KEDA never scales past it (ops/k8s/keda-scaledobject.yaml maxReplicaCount).
if [ -z "$tenants" ]; then
create mllama.requests 8 --config max.message.bytes=$max_request_bytes --config $append_time
create mllama.replies 8 --config retention.ms=$reply_retention_ms \
  --config max.message.bytes=$max_record_bytes
create mllama.cancel 1 --config cleanup.policy=compact,delete \
  --config retention.ms=$cancel_retention_ms --config $append_time
fi
for t in $tenants; do
  create "mllama.requests.$t" 8 --config max.message.bytes=$max_request_bytes \
    --config $append_time
  create "mllama.replies.$t" 8 --config retention.ms=$reply_retention_ms \
    --config max.message.bytes=$max_record_bytes
  create "mllama.cancel.$t" 1 --config cleanup.policy=compact,delete \
    --config retention.ms=$cancel_retention_ms --config $append_time
done
# Each gateway instance reads only its own reply topic (one per tenant), so
# replicas never see each other's records.
gateway_reply() {
  create "$1.gw-$2" $gateway_reply_partitions --config retention.ms=$gateway_reply_retention_ms \
    --config max.message.bytes=$max_record_bytes
}
for g in $gateways; do
  if [ -z "$tenants" ]; then
    gateway_reply mllama.replies "$g"
  fi
  for t in $tenants; do
    gateway_reply "mllama.replies.$t" "$g"
  done
done
create mllama.dlt 1 --config retention.ms=$dlt_retention_ms \
  --config max.message.bytes=$max_record_bytes

# One summary line per topic, for the log.
"$kafka_topics" --bootstrap-server "$bootstrap" --describe --topic 'mllama[.].*' | grep PartitionCount
