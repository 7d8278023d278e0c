#!/bin/sh
# One-shot `setup` service of docker-compose.yml: installs the Elasticsearch templates and ILM
# policy (`gpuops elk install`) and imports the Kibana saved objects of elk/kibana. Both are
# idempotent, so `docker compose run --rm setup` can be repeated. Waits with a deadline.
set -eu
es=${GPUOPS_ELASTICSEARCH_URL:-http://elasticsearch:9200}
kibana=${KIBANA_URL:-http://kibana:5601}
timeout=${SETUP_TIMEOUT:-300}

wait_for() {  # what, command...
    what=$1
    shift
    deadline=$(($(date +%s) + timeout))
    until "$@" >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "setup: $what not ready after ${timeout}s" >&2
            exit 1
        fi
        sleep 2
    done
}
kibana_available() { curl -fsS "$kibana/api/status" | grep -q '"level":"available"'; }

wait_for Elasticsearch curl -fsS "$es/_cluster/health?wait_for_status=yellow&timeout=5s"
gpuops elk install --url "$es" --templates-dir /app/elk/elasticsearch

wait_for Kibana kibana_available
for file in /app/elk/kibana/*.ndjson; do
    answer=$(curl -fsS -X POST "$kibana/api/saved_objects/_import?overwrite=true" \
        -H 'kbn-xsrf: true' --form "file=@$file")
    # Kibana answers 200 also when objects fail; success:true means every one was imported.
    case $answer in
        *'"success":true'*) echo "setup: imported $file" ;;
        *) echo "setup: importing $file failed: $answer" >&2; exit 1 ;;
    esac
done
echo "setup: done"
