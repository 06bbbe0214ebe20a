-- Traffic rules over the loop-detector stream (PIPES §2.2 running example).
-- One reading per vehicle passing a detector: station, lane, speed (m/s), length (m),
-- and the reading's own event time ts. Readings up to 2 s out of order are reordered.
CREATE STREAM traffic (station INT, lane INT, speed DOUBLE, length DOUBLE, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/traffic/+/readings';

-- station_speed: per station, the average speed over the last 15 minutes, reported
-- for the last reading of each minute (data-driven window, ESL §5.3; SLIDE keeps the
-- yield tuple of each one-minute slot).
CREATE STREAM station_speed AS
  SELECT station, ts,
         avg(speed) OVER (PARTITION BY station RANGE 15 MINUTES PRECEDING SLIDE 1 MINUTE) AS avg_speed
  FROM traffic;

-- congestion (PIPES §2.2): a station whose 15-minute average speed is below 15 m/s.
-- An incident per station: it opens at the first station_speed row under 15 m/s and
-- resolves at the station's first row that is not (the default for an alert without
-- a window: its input rows are its condition).
CREATE ALERT congestion SEVERITY warning
  MESSAGE 'station {station}: {avg_speed} m/s over 15 minutes'
  AS SELECT station, ts, avg_speed FROM station_speed WHERE avg_speed < 15;

-- segment_minmax (WID Q1): per station, the highest and lowest speed over 5 minutes,
-- every minute (domain-driven window: extents [e - 5 min, e) for every whole minute e,
-- each emitted once when the watermark passes e).
CREATE STREAM segment_minmax AS
  SELECT station, window_end, max(speed) AS max_speed, min(speed) AS min_speed
  FROM traffic [RANGE 5 MINUTES SLIDE 1 MINUTE]
  GROUP BY station;

-- station_volume (WID Q2/Q4): per station, how many of its last 1,000 readings were
-- long vehicles (over 10 m), reported every 100 readings (count-based window with a
-- slide: the yield tuple of each 100-row slot).
CREATE STREAM station_volume AS
  SELECT station, ts,
         count(*) OVER (PARTITION BY station ROWS 999 PRECEDING SLIDE 100) AS vehicles,
         sum(CASE WHEN length > 10 THEN 1 ELSE 0 END)
           OVER (PARTITION BY station ROWS 999 PRECEDING SLIDE 100) AS long_vehicles
  FROM traffic;

-- silent_detector: a station that sent no reading for 5 minutes. Active expiration
-- (ESL §5.2): the station's newest reading expires 5 minutes after its timestamp even
-- if no reading of that station ever follows; silence() emits its timestamp then.
-- The incident resolves at the station's next reading, whatever it is.
CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP
  LANGUAGE PYTHON AS 'rules.udas:Silence';
CREATE ALERT silent_detector SEVERITY warning
  MESSAGE 'station {station}: no reading since {last_reading}'
  RESOLVE WHEN TRUE
  AS SELECT station,
            silence(ts) OVER (PARTITION BY station RANGE 5 MINUTES PRECEDING ACTIVE EXPIRATION) AS last_reading
     FROM traffic;

-- stopped_vehicle (Linear Road style): four consecutive reports of a lane all below
-- 1 m/s mean a vehicle standing on the detector: a stopped vehicle or an accident.
-- An incident per lane; it resolves at the lane's first report that is not stopped
-- (a vehicle moving over the detector again: the default).
CREATE STREAM lane_reports AS
  SELECT station, lane, ts,
         max(speed) OVER (PARTITION BY station, lane ROWS 3 PRECEDING) AS max_speed,
         count(*) OVER (PARTITION BY station, lane ROWS 3 PRECEDING) AS reports
  FROM traffic;
CREATE ALERT stopped_vehicle SEVERITY critical
  MESSAGE 'station {station} lane {lane}: vehicle stopped (4 reports under 1 m/s)'
  AS SELECT station, lane, ts, max_speed FROM lane_reports
     WHERE reports = 4 AND max_speed < 1.0;

-- accident (Linear Road, Arasu et al. 2004): tracked vehicles send a position report
-- every 30 s; a vehicle is stopped when its last four reports are at one position, and
-- two stopped vehicles at one position are an accident. A 30-second tumble holds one
-- report of each vehicle, so its count is the number of vehicles stopped there: one
-- alert per 30 s while the accident lasts. The incident resolves at the end of the first
-- 30 s without one (an alert comes at every 30 s boundary while the accident lasts).
CREATE STREAM positions (vid BIGINT, speed DOUBLE, xway INT, lane INT, dir INT, seg INT,
                         pos INT, ts TIMESTAMP)
  ORDER BY ts SLACK 2 SECONDS SOURCE 'lookout/positions/+/readings';
CREATE STREAM last_reports AS
  SELECT vid, xway, dir, seg, pos, ts,
         count(*) OVER (PARTITION BY vid ROWS 3 PRECEDING) AS reports,
         min(pos) OVER (PARTITION BY vid ROWS 3 PRECEDING) AS first_pos,
         max(pos) OVER (PARTITION BY vid ROWS 3 PRECEDING) AS last_pos
  FROM positions;
CREATE STREAM stopped_vehicles AS
  SELECT vid, xway, dir, seg, pos, ts FROM last_reports
  WHERE reports = 4 AND first_pos = last_pos;
CREATE ALERT accident SEVERITY critical
  MESSAGE 'accident on expressway {xway} segment {seg} at {pos}: {vehicles} vehicles stopped'
  RESOLVE AFTER 30 SECONDS
  AS SELECT xway, dir, seg, pos, window_end, count(*) AS vehicles
     FROM stopped_vehicles [RANGE 30 SECONDS]
     GROUP BY xway, dir, seg, pos HAVING count(*) >= 2;

-- speeding: a reading faster than its station's limit, from the station registry
-- (a reference table: rules/stations.csv, one row per station with its road segment
-- and speed limit in m/s; 36.1 m/s = 130 km/h). A stream-table join: each reading
-- looks its station up; a station missing from the registry is never speeding. One
-- incident for the whole road (the rule has no key): it lasts while speeding readings
-- come at most 5 minutes apart.
CREATE TABLE stations (station INT, segment STRING, speed_limit DOUBLE)
  FROM CSV 'stations.csv';
CREATE ALERT speeding SEVERITY warning
  MESSAGE 'station {station} ({segment}) lane {lane}: {speed} m/s, limit {speed_limit} m/s'
  RESOLVE AFTER 5 MINUTES
  AS SELECT t.station, s.segment, t.lane, t.ts, t.speed, s.speed_limit
     FROM traffic t JOIN stations s ON t.station = s.station
     WHERE t.speed > s.speed_limit;
