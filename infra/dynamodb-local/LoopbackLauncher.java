import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.List;

import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;

/**
 * LoopbackLauncher starts Amazon DynamoDB Local listening on 127.0.0.1 only.
 *
 * DynamoDB Local's command line has no listen-address option and its Jetty server binds every
 * interface. This launcher builds the server from the usual arguments (for example
 * {@code -inMemory -sharedDb -port 8000 -disableTelemetry}) through DynamoDB Local's own
 * ServerRunner, sets the host of each Jetty connector to 127.0.0.1 before starting it, and prints
 * one line, "ready 127.0.0.1:PORT", once it listens. {@code -port 0} (which DynamoDB Local itself
 * refuses) picks a free port, so that callers need not guess one. With {@code -exitWithStdin}
 * (the launcher's own option) it stops when its standard input closes, that is when the test
 * process that started it ends, however it ends.
 */
public final class LoopbackLauncher {
    private static final String HOST = "127.0.0.1";

    public static void main(String[] args) throws Exception {
        boolean anyPort = false;
        boolean exitWithStdin = false;
        List<String> serverArgs = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("-exitWithStdin")) {
                exitWithStdin = true;
            } else if (args[i].equals("-port") && i + 1 < args.length && args[i + 1].equals("0")) {
                anyPort = true;
                serverArgs.add("-port");
                serverArgs.add("8000"); // replaced by an ephemeral port below, before anything binds
                i++;
            } else {
                serverArgs.add(args[i]);
            }
        }
        args = serverArgs.toArray(new String[0]);
        DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
        Field field = DynamoDBProxyServer.class.getDeclaredField("server");
        field.setAccessible(true);
        Server jetty = (Server) field.get(proxy);
        Connector[] connectors = jetty.getConnectors();
        if (connectors.length == 0) {
            throw new IllegalStateException("DynamoDB Local's Jetty server has no connectors");
        }
        for (Connector c : connectors) {
            if (!(c instanceof ServerConnector)) {
                throw new IllegalStateException("unexpected connector " + c.getClass().getName());
            }
            ServerConnector sc = (ServerConnector) c;
            sc.setHost(HOST);
            if (anyPort) {
                sc.setPort(0);
            }
        }
        proxy.start();
        int port = ((ServerConnector) connectors[0]).getLocalPort();
        System.out.println("ready " + HOST + ":" + port);
        System.out.flush();

        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                proxy.stop();
            } catch (Exception e) {
                // The process is ending either way.
            }
        }));
        if (!exitWithStdin) {
            proxy.join();
            return;
        }
        // Standard input stays open while the parent lives; its end is the signal to stop.
        while (System.in.read() != -1) {
            // Input is ignored.
        }
        System.exit(0);
    }
}
