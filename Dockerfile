# Builds the loopgate binary (rustls: no OpenSSL) into a slim image.
FROM rust:1-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --bin loopgate

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/loopgate /usr/local/bin/loopgate
COPY conf /etc/loopgate
WORKDIR /etc/loopgate
EXPOSE 8080 9091
ENTRYPOINT ["loopgate"]
CMD ["run", "--config", "/etc/loopgate/gateway.yaml"]
